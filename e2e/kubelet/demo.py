#!/usr/bin/env python3
"""Two GPU handovers on the real node (e2e/kubelet/real-node.sh up), observed from the API.

Round 1, a cooperative victim: a fake vLLM holding every GPU of the node, with a 1 s preStop
sleep, is deleted; it gets SIGTERM after the hook and exits; the device manager frees its GPUs
and the replacement, Pending until then, is bound and started on them.
Round 2, a stubborn victim: a fake vLLM draining a request that never finishes
(`--shutdown-timeout 60`, `--busy 1` with an endless generation) outlives SIGTERM, so the
kubelet kills it when the grace period (3 s) ends; only then does the third pod get the GPUs.

Prints each round's timeline (milliseconds after the delete request, as seen by a watch on the
API server) and the device IDs the plugin allocated. Exits non-zero if a replacement got the GPUs
before its victim was gone, or if an expected exit code is not seen.

Usage: e2e/kubelet/demo.py --kubeconfig FILE --kubectl PATH --run-dir DIR [--gpus 8]
"""

import argparse
import json
import subprocess
import sys
import threading
import time

IMAGE = "localhost/gpuqueue/fake-vllm:offline"
NAMESPACE = "real-node-demo"


def pod(name, gpus, grace, args, pre_stop_sleep=None):
    container = {
        "name": "vllm",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "args": ["--listen", "0.0.0.0:8000", *args],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
        "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 1},
    }
    if pre_stop_sleep:
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": pre_stop_sleep}}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"gpuqueue.io/real-node": "true"},
            "terminationGracePeriodSeconds": grace,
            # No cluster DNS in the harness.
            "dnsPolicy": "Default",
            "containers": [container],
        },
    }


class Watch:
    """Every pod event in the namespace, stamped with the time it arrived."""

    def __init__(self, kubectl):
        self.events = []
        self.lock = threading.Condition()
        self.proc = subprocess.Popen(
            kubectl + ["-n", NAMESPACE, "get", "pods", "-w", "-o", "json", "--output-watch-events"],
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        decoder, buf = json.JSONDecoder(), ""
        for line in self.proc.stdout:
            buf += line
            try:
                event, end = decoder.raw_decode(buf.lstrip())
            except json.JSONDecodeError:
                continue
            buf = buf.lstrip()[end:]
            with self.lock:
                self.events.append((time.monotonic(), event))
                self.lock.notify_all()

    def first(self, since, pred, timeout=60):
        """The arrival time and object of the first event after `since` that matches."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                for at, event in self.events:
                    if at >= since and pred(event["type"], event["object"]):
                        return at, event["object"]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None, None
                self.lock.wait(left)

    def stop(self):
        self.proc.terminate()


def named(name, pred):
    return lambda kind, obj: obj["metadata"]["name"] == name and pred(kind, obj)


def condition(obj, kind):
    return any(
        c["type"] == kind and c["status"] == "True" for c in obj.get("status", {}).get("conditions", [])
    )


def terminated(obj):
    for status in obj.get("status", {}).get("containerStatuses", []):
        if "terminated" in status.get("state", {}):
            return status["state"]["terminated"]
    return None


def allocations(run_dir):
    with open(f"{run_dir}/logs/deviceplugin.log") as log:
        return [line.split()[-1] for line in log if " allocate " in line]


def handover(kubectl, watch, victim, replacement, expect_exit):
    ms = lambda t: f"{(t - t0) * 1000:7.0f} ms" if t else "   never"
    apply(kubectl, replacement)
    name, successor = victim["metadata"]["name"], replacement["metadata"]["name"]
    at, obj = watch.first(0, named(successor, lambda k, o: k != "DELETED" and o["status"].get("conditions")))
    pending = obj and not condition(obj, "PodScheduled")
    print(f"  {successor} created while {name} holds the GPUs: Pending={pending}")
    t0 = time.monotonic()
    subprocess.run(kubectl + ["-n", NAMESPACE, "delete", "pod", name, "--wait=false"], check=True, capture_output=True)
    t_exit, dead = watch.first(t0, named(name, lambda k, o: terminated(o) is not None))
    t_terminal, _ = watch.first(t0, named(name, lambda k, o: o["status"].get("phase") in ("Succeeded", "Failed")))
    t_gone, _ = watch.first(t0, named(name, lambda k, o: k == "DELETED"))
    t_bound, _ = watch.first(t0, named(successor, lambda k, o: condition(o, "PodScheduled")))
    t_running, _ = watch.first(t0, named(successor, lambda k, o: o["status"].get("phase") == "Running"))
    t_ready, _ = watch.first(t0, named(successor, lambda k, o: condition(o, "Ready")))
    state = terminated(dead) if dead else {}
    grace = victim["spec"]["terminationGracePeriodSeconds"]
    for label, at in [
        (f"delete {name} (grace {grace} s)", t0),
        (f"{name} container exited (code {state.get('exitCode')}, {state.get('reason')})", t_exit),
        (f"{name} phase terminal (its GPUs schedulable)", t_terminal),
        (f"{name} gone from the API", t_gone),
        (f"{successor} bound", t_bound),
        (f"{successor} Running", t_running),
        (f"{successor} Ready", t_ready),
    ]:
        print(f"  {label:<48}{ms(at)}")
    ok = True
    if state.get("exitCode") != expect_exit:
        print(f"  FAIL: {name} exited with {state.get('exitCode')}, expected {expect_exit}")
        ok = False
    if not (t_gone and t_bound and t_ready) or t_bound < t_exit:
        print(f"  FAIL: {successor} was not bound after {name} exited")
        ok = False
    return ok


def apply(kubectl, obj):
    subprocess.run(kubectl + ["apply", "-f", "-"], input=json.dumps(obj), text=True, check=True, capture_output=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--kubectl", required=True)
    parser.add_argument("--run-dir", required=True, help="the real node's run dir (for the device plugin's log)")
    parser.add_argument("--gpus", type=int, default=8, help="the node's nvidia.com/gpu; each pod takes them all")
    args = parser.parse_args()
    kubectl = [args.kubectl, f"--kubeconfig={args.kubeconfig}"]

    # A namespace left by an earlier run goes first; then this run's allocations are the last.
    subprocess.run(kubectl + ["delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=60s"], check=True)
    subprocess.run(kubectl + ["create", "namespace", NAMESPACE], check=True, capture_output=True)
    earlier = len(allocations(args.run_dir))
    watch = Watch(kubectl)
    first = pod("first", args.gpus, 3, [], pre_stop_sleep=1)
    # One synthetic request that never ends, drained for up to 60 s: only SIGKILL stops it.
    endless = ["--busy", "1", "--busy-max-tokens", "1000000", "--natural-length", "1000000", "--max-model-len", "2000000"]
    second = pod("second", args.gpus, 3, ["--shutdown-timeout", "60", *endless])
    third = pod("third", args.gpus, 3, [])
    ok = True
    try:
        apply(kubectl, first)
        if watch.first(0, named("first", lambda k, o: condition(o, "Ready")))[0] is None:
            subprocess.run(kubectl + ["-n", NAMESPACE, "describe", "pod", "first"])
            sys.exit(f"first never became Ready (watch running: {watch.proc.poll() is None}); see the kubelet's log")
        print("round 1: cooperative victim (preStop sleep 1 s, exits on SIGTERM)")
        ok &= handover(kubectl, watch, first, second, 0)

        print("round 2: stubborn victim (drains an endless request past SIGTERM)")
        ok &= handover(kubectl, watch, second, third, 137)
        ids = allocations(args.run_dir)[earlier:]
        print(f"device plugin allocations, in order: {ids}")
        if len({",".join(sorted(i.split(","))) for i in ids}) != 1 or len(ids) != 3:
            print("FAIL: expected the same devices allocated three times")
            ok = False
    finally:
        subprocess.run(kubectl + ["delete", "namespace", NAMESPACE, "--wait=false"], capture_output=True)
        watch.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
