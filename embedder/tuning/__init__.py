"""Tuning: the search over runtime x precision x pass shape x batch budget x threads,
the accuracy guard every candidate passes, and the calibration texts it measures on.
Torch-free: candidates run through whatever loader the caller gives (``load_runtime``
in production, fakes in tests)."""
