"""The device fingerprint: stable for one kind of CPU, different when a flag that
changes the fastest kernels differs."""

from __future__ import annotations

from embedder.core.device import cpu_fingerprint, parse_cpuinfo

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512_bf16 avx512_vnni avx_vnni aes
processor\t: 1
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512_bf16 avx512_vnni avx_vnni aes
"""
XEON = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_int8 amx_tile
"""


def test_the_fingerprint_names_the_model_the_speed_flags_and_the_cores() -> None:
    assert cpu_fingerprint(EPYC, cores=2) == (
        "cpu:amd-epyc-9r14-96-core-processor:avx2+avx512_bf16+avx512_vnni+avx512f+avx_vnni:2c"
    )
    assert cpu_fingerprint(XEON, cores=4) == (
        "cpu:intel-xeon-platinum-8488c:amx_bf16+amx_int8+avx2+avx512_bf16+avx512_vnni+avx512f:4c"
    )


def test_it_is_stable_and_ignores_flags_that_do_not_change_speed() -> None:
    assert cpu_fingerprint(EPYC, cores=2) == cpu_fingerprint(EPYC, cores=2)
    extra = EPYC.replace(" aes", " aes sha_ni rdrand")
    assert cpu_fingerprint(extra, cores=2) == cpu_fingerprint(EPYC, cores=2)


def test_it_differs_when_a_speed_flag_or_the_core_count_differs() -> None:
    without_bf16 = EPYC.replace(" avx512_bf16", "")
    assert cpu_fingerprint(without_bf16, cores=2) != cpu_fingerprint(EPYC, cores=2)
    assert "avx512_bf16" not in cpu_fingerprint(without_bf16, cores=2)
    assert cpu_fingerprint(EPYC, cores=4) != cpu_fingerprint(EPYC, cores=2)


def test_unreadable_cpuinfo_gives_an_unknown_cpu_not_an_error() -> None:
    assert parse_cpuinfo("") == ("unknown", frozenset())
    assert cpu_fingerprint("", cores=1) == "cpu:unknown:none:1c"
