"""GET each path over its own TLS connection with Python's ssl (OpenSSL), reusing the
first connection's session for the later ones, and print one line per request:
    <TLS version> <ALPN> <session reused> <status code> <body length>
Usage: ssl_get.py PORT CAFILE TLS12(0|1) PATH...   (name checked: localhost)"""
import socket
import ssl
import sys

port, cafile, tls12, paths = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", sys.argv[4:]
ctx = ssl.create_default_context(cafile=cafile)
ctx.set_alpn_protocols(["http/1.1"])
if tls12:
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2


def read_answer(s):
    """One HTTP/1.1 answer with a Content-Length body: (status, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise SystemExit("EOF before the head")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise SystemExit("EOF in the body")
        body += chunk
    return int(lines[0].split(" ")[1]), body[:length]


session = None
for path in paths:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    s = ctx.wrap_socket(raw, server_hostname="localhost", session=session)
    s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status, body = read_answer(s)
    print(s.version(), s.selected_alpn_protocol(), s.session_reused, status, len(body))
    session = session or s.session
    s.close()
