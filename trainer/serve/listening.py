"""The server's listening socket, bound before the model loads: by the one process, or by the
supervisor for its workers to share. Port 0 takes any free port, the kernel's choice said on
the server's first line: no window opens between choosing a port and binding it, in which
another process could take it."""

from __future__ import annotations

import socket
import sys


def opened(host: str, port: int | None, default: int) -> socket.socket | None:
    """The socket listening at `port` (None: `default`, Vertex AI's AIP_HTTP_PORT), or None
    after one `error:` line saying why it cannot be (the port taken, the host not this
    machine's)."""
    port = default if port is None else port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        print(f"error: cannot listen on {host}:{port}: {error.strerror or error}",
              file=sys.stderr, flush=True)  # fmt: skip
        return None
    sock.set_inheritable(True)
    return sock
