"""What every task's engine shares: the device's turns (``turns``), a thread that owns
the model (``thread``), pulling that outlives a queue's hiccups and the settling of jobs
nobody waits for (``pulling``), and the worker-side metrics (``metrics``). Each task's
loop is its own (continuous batching, OCR rounds and pipelined embedding batches
differ); these are the parts that are the same in all of them."""
