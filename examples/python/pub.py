"""Publishes a power supply's current, 10 values a second.

Run: python examples/python/pub.py [locator] [count]
(default milonga:///lab, 50 values), then python examples/python/sub.py.
"""

import math
import sys
import time

import milonga

locator = sys.argv[1] if len(sys.argv) > 1 else "milonga:///lab"
count = int(sys.argv[2]) if len(sys.argv) > 2 else 50

with milonga.open(locator, name="pub-example") as node:
    current = node.publisher("sr/ps/1/current", milonga.PublisherQos(history=10))
    for i in range(count):
        current.put(100.0 + math.sin(i / 5))
        time.sleep(0.1)
    print(f"published {count} values of sr/ps/1/current")
