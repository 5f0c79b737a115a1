"""Stands in for ``python -m tfopt.data.serve`` in the launcher's fast tests: it only listens.

``python fake_serve.py ROLE --port P ...`` accepts connections on P until killed; with
``$FAKE_SERVE_DIR`` it writes its pid to ``ROLE-PORT.pid`` there first. ``$FAKE_SERVE_EXIT``
makes the worker role exit with that code at once, and ``$FAKE_SERVE_MUTE`` makes it never
listen.
"""

import os
import socket
import sys
import time

role, port = sys.argv[1], int(sys.argv[sys.argv.index("--port") + 1])
folder = os.environ.get("FAKE_SERVE_DIR")
if folder:
    with open(os.path.join(folder, f"{role}-{port}.pid"), "w") as f:
        f.write(str(os.getpid()))
if role == "worker" and os.environ.get("FAKE_SERVE_EXIT"):
    sys.exit(int(os.environ["FAKE_SERVE_EXIT"]))
if not (role == "worker" and os.environ.get("FAKE_SERVE_MUTE")):
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("", port))  # every interface, as TensorFlow's servers
    server.listen()
    print(f"{role} listening on port {port}", flush=True)
time.sleep(120)
