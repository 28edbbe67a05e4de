"""Which peers bench.served measures."""

from __future__ import annotations

import pytest

from bench.peers import options
from tests.bench.peers.test_side_by_side import FakePeer


def test_a_missing_peer_is_skipped_by_default_and_an_error_by_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Missing(FakePeer):
        def missing(self) -> str | None:
            return "not installed; run bench/peers/fake.sh"

    monkeypatch.setattr(options, "PEERS", {"fake": "x:y"})
    monkeypatch.setattr(options, "get_peer", lambda name: Missing(0, {}))
    assert options.chosen_peers(None) == []
    assert "skipping the peer fake: not installed" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--peer fake: not installed"):
        options.chosen_peers(["fake"])
    assert options.chosen_peers(["none"]) == []
