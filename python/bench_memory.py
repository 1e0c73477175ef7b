"""Memory of receiving 1 MiB float64 arrays from another process (tcp):
the RSS a subscriber grows by per received array it keeps (docs/benchmarks.md).
Run: python/.venv/bin/python python/bench_memory.py"""
import os, resource, subprocess, sys, tempfile, time
import numpy as np
import milonga

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

d = tempfile.mkdtemp()
loc = "milonga:///pymem"
child = subprocess.Popen([sys.executable, "-c", f"""
import milonga, numpy as np, time
with milonga.open("{loc}", name="src", runtime_dir="{d}", transport="tcp") as n:
    p = n.publisher("mem", milonga.PublisherQos(reliable=True))
    while p.subscriber_count() < 1: time.sleep(0.01)
    a = np.random.default_rng(1).random(131072)
    for i in range(105):
        p.put(a)
        time.sleep(0.01)
    time.sleep(2)
"""])
with milonga.open(loc, name="dst", runtime_dir=d, transport="tcp") as n:
    sub = n.subscribe("mem")
    def nxt():
        while True:
            e = sub.recv(timeout=20)
            if isinstance(e, milonga.Sample):
                return e.value
    for _ in range(5):
        nxt()
    base = rss()
    one = nxt()
    after_one = rss()
    kept = [nxt() for _ in range(99)]
    after_100 = rss()
    print(f"array: {one.nbytes} bytes, owndata={one.flags.owndata}, writeable={one.flags.writeable}")
    print(f"RSS growth holding 1 received array: {(after_one-base)/2**20:.2f} MiB")
    print(f"RSS growth holding 100 received arrays: {(after_100-base)/2**20:.1f} MiB ({(after_100-base)/100/2**20:.3f} MiB per array)")
child.wait()
