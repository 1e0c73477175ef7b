"""Calls a service and prints the reply, or why there is none.

Run: python examples/python/call.py [locator] [key] [value]
(default milonga:///lab, sr/ps/1/set_current, 12.5).
"""

import json
import sys
import time

import milonga

locator = sys.argv[1] if len(sys.argv) > 1 else "milonga:///lab"
key = sys.argv[2] if len(sys.argv) > 2 else "sr/ps/1/set_current"
value = json.loads(sys.argv[3]) if len(sys.argv) > 3 else 12.5

with milonga.open(locator, name="call-example") as node:
    # Discovery needs a moment after opening: retry "no server" briefly.
    for attempt in range(50):
        try:
            reply = node.call(key, value, timeout=2.0)
            break
        except milonga.NoServer:
            if attempt == 49:
                raise
            time.sleep(0.1)
    print(json.dumps(reply))
