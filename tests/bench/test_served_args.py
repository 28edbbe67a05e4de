"""bench.served's options: the profile the server runs, the peers' loads, the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import served
from bench.peers.compare import Load


def test_the_profile_override_reaches_the_device_profile(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text("forward_tokens: 1024\ndtype: float32\n")
    args = served.parse_args(["--fleet-profile", str(profile), "--dtype", "bfloat16"])
    spec = served.served_spec(args)
    cpu = spec.profile("cpu")
    assert (cpu.forward_tokens, cpu.dtype) == (1024, "bfloat16")  # --dtype wins over the file
    cuda = served.served_spec(served.parse_args(["--device", "cuda", "--runtime", "onnx"]))
    assert cuda.profile("cuda").runtime == "onnx"
    assert cuda.profile("cpu").runtime == "torch"


def test_the_served_fleet_file_leaves_the_profile_to_tuning_unless_overridden() -> None:
    from embedder.core.fleet import Fleet
    from embedder.tuned import tunable

    def written(spec):  # what the server reads back from the benchmark's fleet file
        return Fleet.model_validate(served.one_model_fleet(spec)).get(spec.name)

    default = served.served_spec(served.parse_args([]))
    assert tunable(written(default), "cpu") is None
    pinned = served.served_spec(served.parse_args(["--runtime", "onnx"]))
    assert tunable(written(pinned), "cpu") == "the fleet names runtime onnx"


def test_a_bad_override_is_a_clear_error(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text('{"max_batch_tokens": -1}')
    with pytest.raises(SystemExit, match="profile override is invalid"):
        served.served_spec(served.parse_args(["--fleet-profile", str(profile)]))
    with pytest.raises(SystemExit):
        served.parse_args(["--dtype", "float64"])


def test_peer_options_and_their_json(tmp_path: Path) -> None:
    args = served.parse_args(
        ["--peer", "infinity", "--peer-loads", "8x2,32x1", "--peer-batch-sizes", "16,64"]
    )
    assert args.peer == ["infinity"]
    assert args.peer_loads == [Load(8, 2), Load(32, 1)]
    assert args.peer_batch_sizes == [16, 64]
    assert served.parse_args([]).peer_loads == [Load(16, 8), Load(64, 1)]
    dumped = json.loads(json.dumps(vars(args), default=str))
    assert dumped["peer_loads"] == ["8x2", "32x1"]
    for bad in (["--peer", "nope"], ["--peer-loads", "16"], ["--peer-batch-sizes", "0"]):
        with pytest.raises(SystemExit):
            served.parse_args(bad)
