"""A device server: a simulated power supply `sr/ps/1`, as a Tango device
server would be (the same keys as examples/rust/device_server.rs):

- `sr/ps/1/current`: the reading at 10 Hz (reliable, history 100)
- `sr/ps/1/state`: "ON" / "OFF" (history 1, on change)
- `sr/ps/1/waveform`: the last 1024 readings as a float64 numpy array, 1 Hz
- commands `sr/ps/1/set_current` (0..120 A) and `sr/ps/1/off`

Run: python examples/python/device_server.py [locator] [seconds]
(default milonga:///lab, until Ctrl-C).
"""

import math
import sys
import threading
import time

import numpy as np

import milonga

locator = sys.argv[1] if len(sys.argv) > 1 else "milonga:///lab"
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else math.inf

lock = threading.Lock()
target = 100.0
on = True

with milonga.open(locator, name="ps-1") as node:
    current = node.publisher(
        "sr/ps/1/current", milonga.PublisherQos(reliable=True, history=100)
    )
    state = node.publisher("sr/ps/1/state", milonga.PublisherQos(history=1))
    waveform = node.publisher("sr/ps/1/waveform", milonga.PublisherQos(history=1))

    def set_current(req: milonga.Request) -> float:
        global target
        value = float(req.value)
        if not 0.0 <= value <= 120.0:
            raise milonga.ServiceError("out_of_range", f"{value} A is outside 0..120 A")
        with lock:
            target = value
        return value

    def off(req: milonga.Request) -> str:
        global on
        with lock:
            on = False
        state.put("OFF")
        return "OFF"

    node.serve("sr/ps/1/set_current", set_current)
    node.serve("sr/ps/1/off", off)
    state.put("ON")
    print("ps-1 running", flush=True)

    history = np.zeros(1024)
    reading = 0.0
    started = time.monotonic()
    tick = 0
    try:
        while time.monotonic() - started < seconds:
            with lock:
                goal = target if on else 0.0
            reading += (goal - reading) * 0.5
            value = reading + 0.05 * math.sin(tick / 3)
            current.put(value)
            history = np.roll(history, -1)
            history[-1] = value
            tick += 1
            if tick % 10 == 0:
                waveform.put(history)
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    print(f"ps-1 stopped after {tick} readings", flush=True)
