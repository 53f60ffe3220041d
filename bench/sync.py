"""Synchronisation accuracy: clock service across "hosts", device clock fit, lag recovery.

    python bench/sync.py [--seconds 20]

1. Clock service on loopback: three agent processes whose clocks are skewed (offset and
   drift known exactly, since they share this machine's monotonic clock) publish a 1 kHz
   stream to a listening recorder over CurveZMQ; every recorded sample time is compared
   with the truth. Goal (issue 5): under 50 µs median, under 200 µs p99.
2. Device clock → host clock: a 20 kHz µs counter read with USB-like latency; lower
   envelope against least squares.
3. Lag between two streams with a known injected lag at 1 kHz (analysis.alignment).
   Goal: under 1 ms.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_json
from wattlab.acquisition.acquirers import Chunk
from wattlab.acquisition.session import ClockSkew, run_agent
from wattlab.acquisition.session.agent import SKEW_ENV
from wattlab.device_models.clock_fit import fit_lower_envelope
from wattlab.runfile import schema
from wattlab.samples import Channel, SourceDescriptor
from wattlab.sync.bus import (
    ClientSecurity,
    ControlClient,
    create_keypair,
    load_keypair,
    load_public_key,
)
from wattlab.sync.bus.publisher import local_endpoint
from wattlab.sync.recorder import RecorderConfig, hosts_ready
from wattlab.sync.recorder.process import Recorder

SKEWS = {
    "node1": ClockSkew(0, 0.0),
    "node2": ClockSkew(3_600_000_000_000, 50.0),
    "node3": ClockSkew(-250_000_000, -100.0),
}


class Ramp:
    """1 kHz synthetic stream stamped with the host clock."""

    def open(self):
        self.next_ns = time.monotonic_ns()
        return [SourceDescriptor("ramp", "bench", "Ramp", (Channel("power_w", "W"),))]

    def poll(self):
        time.sleep(0.02)
        now = time.monotonic_ns()
        t = np.arange(self.next_ns, now, 1_000_000, dtype=np.int64)
        if t.size == 0:
            return []
        self.next_ns = int(t[-1]) + 1_000_000
        return [Chunk("ramp", t, np.ones((t.size, 1)))]

    def close(self):
        pass


def agent_process(endpoint: str, key: str, server_key: str) -> int:
    security = ClientSecurity(load_keypair(key), load_public_key(server_key))
    result = run_agent(endpoint, security.keys.name, [("ramp", Ramp())], security,
                       skew=ClockSkew.from_env())
    return 0 if result.finished_by_recorder else 1


def clock_service(seconds: float) -> dict:
    """Three skewed agents over CURVE to one recorder, in a folder removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="wattlab-bench-sync-") as folder:
        return _clock_service(Path(folder), seconds)


def _clock_service(folder: Path, seconds: float) -> dict:
    import os
    import subprocess

    keys, allowed = folder / "keys", folder / "allowed"
    allowed.mkdir(parents=True)
    for name in ("recorder", *SKEWS):
        create_keypair(keys, name)
        if name != "recorder":
            (allowed / f"{name}.key").write_bytes((keys / f"{name}.key").read_bytes())
    path = str(folder / "run.h5")
    endpoint = local_endpoint()
    recorder = Recorder(RecorderConfig(
        endpoint=endpoint, output=path, session_start_ns=time.monotonic_ns(),
        listen="tcp://127.0.0.1:0", server_key=str(keys / "recorder.key_secret"),
        allowed_keys=str(allowed), expected_hosts=list(SKEWS)))
    thread = threading.Thread(target=recorder.run)
    thread.start()
    agents = [
        subprocess.Popen([sys.executable, __file__, "--agent", recorder.listen_endpoint,
                          str(keys / f"{n}.key_secret"), str(keys / "recorder.key")],
                         env={**os.environ, SKEW_ENV: f"{s.offset_ns}:{s.drift_ppm}"})
        for n, s in SKEWS.items()
    ]
    control = ControlClient(endpoint)
    try:
        deadline = time.monotonic() + 60
        while not hosts_ready(control.request("status", 5), list(SKEWS)):
            if time.monotonic() > deadline:
                raise RuntimeError("agents did not connect")
            time.sleep(0.1)
        time.sleep(seconds)
        control.request("stop", 60)
    finally:
        control.close()
        thread.join(60)
        for a in agents:
            a.wait(30)
    rows = {}
    with h5py.File(path) as f:
        start = int(f.attrs[schema.SESSION_START_MONOTONIC_NS])
        for name, skew in SKEWS.items():
            group = f[schema.SOURCES][f"{name}.ramp"]
            sender = group[schema.TIME_HOST_RAW][:]
            truth = np.round((sender - skew.offset_ns) / (1 + skew.drift_ppm * 1e-6))
            err = np.abs(group[schema.TIME][:] + start - truth.astype(np.int64)) / 1e3
            sync = dict(f[schema.SYNC][name].attrs)
            rows[name] = {
                "offset_s": skew.offset_ns / 1e9, "set_drift_ppm": skew.drift_ppm,
                "samples": int(err.size), "err_median_us": float(np.median(err)),
                "err_p99_us": float(np.percentile(err, 99)), "err_max_us": float(err.max()),
                "drift_error_ppm": float(sync[schema.DRIFT_PPM] - skew.drift_ppm),
                "rtt_min_us": float(sync[schema.RTT_MIN_NS]) / 1e3,
                "rtt_median_us": float(sync[schema.RTT_MEDIAN_NS]) / 1e3,
                "clock_probes": int(sync[schema.PROBES]),
            }
    return {"seconds": seconds, "agents": rows}


def device_clock_fit(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    n = 20_000 * 30
    dev_us = np.arange(n, dtype=np.int64) * 50
    drift = 35.0
    truth = 1e12 + dev_us * 1000 / (1 + drift * 1e-6)
    host = (truth + 50_000 + rng.exponential(400_000, n)).astype(np.int64)
    fit = fit_lower_envelope(dev_us, host, 1000.0)
    err = fit.to_host_ns(dev_us) - truth
    slope, icpt = np.polyfit(dev_us.astype(float), host - 1e12, 1)
    ls_err = icpt + slope * dev_us + 1e12 - truth
    return {"samples": n, "set_drift_ppm": drift, "latency": "50 us + exp(400 us)",
            "envelope_err_spread_us": float(np.ptp(err) / 1e3),
            "envelope_err_median_us": float(np.median(err) / 1e3),
            "envelope_drift_error_ppm": float(fit.drift_ppm - drift),
            "least_squares_err_median_us": float(np.median(ls_err) / 1e3),
            "least_squares_err_spread_us": float(np.ptp(ls_err) / 1e3)}


def lag_recovery(trials: int = 20, seed: int = 1) -> dict:
    try:
        from wattlab.analysis.alignment import estimate_lag
    except ImportError as e:
        return {"skipped": f"analysis.alignment not available: {e}"}
    rng = np.random.default_rng(seed)
    rate = 1000.0
    errors = []
    for _ in range(trials):
        n = 60_000
        levels = np.repeat(rng.uniform(100, 400, 400), rng.integers(50, 300, 400))[: n + 2000]
        t = np.arange(levels.size) / rate
        lag_s = rng.uniform(0.005, 0.6)
        ref = levels[1000:1000 + n] + rng.normal(0, 5, n)
        target = np.interp(t[1000:1000 + n] - lag_s, t, levels) + rng.normal(0, 5, n)
        est = estimate_lag(ref, target, rate, max_lag_s=1.0)
        errors.append(abs(est.lag_s - lag_s) * 1e3)
    return {"trials": trials, "rate_hz": rate, "err_median_ms": float(np.median(errors)),
            "err_max_ms": float(np.max(errors))}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--agent":
        return agent_process(*sys.argv[2:5])
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="3 s of clock service, for CI")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 3.0
    result = {"quick": args.quick, "clock_service": clock_service(args.seconds), "device_clock_fit":
              device_clock_fit(), "lag_recovery": lag_recovery(),
              "goals": {"offset_median_us": 50, "offset_p99_us": 200, "lag_error_ms": 1}}
    print(f"clock service on loopback, {args.seconds:g} s, CurveZMQ, 3 skewed agents")
    print(f"{'agent':6} {'offset s':>10} {'drift ppm':>9} {'median µs':>9} {'p99 µs':>8} "
          f"{'max µs':>8} {'drift err ppm':>13} {'rtt min µs':>10}")
    for name, r in result["clock_service"]["agents"].items():
        print(f"{name:6} {r['offset_s']:>10.3f} {r['set_drift_ppm']:>9.1f} "
              f"{r['err_median_us']:>9.1f} {r['err_p99_us']:>8.1f} {r['err_max_us']:>8.1f} "
              f"{r['drift_error_ppm']:>13.2f} {r['rtt_min_us']:>10.0f}")
    d = result["device_clock_fit"]
    print(f"device clock fit (20 kHz, {d['latency']} latency): envelope error spread "
          f"{d['envelope_err_spread_us']:.2f} µs, drift error {d['envelope_drift_error_ppm']:.3f} "
          f"ppm; least squares median error {d['least_squares_err_median_us']:.0f} µs")
    lag = result["lag_recovery"]
    if "skipped" in lag:
        print(f"lag recovery: {lag['skipped']}")
    else:
        print(f"lag recovery at 1 kHz: median error {lag['err_median_ms']:.3f} ms, "
              f"max {lag['err_max_ms']:.3f} ms over {lag['trials']} trials")
    print(f"wrote {write_json(Path(__file__).stem, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
