"""The relay over wss:// with the Python `websockets` client (sync API) and an ssl context
that trusts the test CA: a subscriber and a publisher, one push, acknowledged.
Prints "ok <subscription id>" on success; any failure raises (non-zero exit).
Usage: wss_pubsub.py PORT CAFILE   (name checked: localhost)"""
import json
import ssl
import sys

from websockets.sync.client import connect

port, cafile = int(sys.argv[1]), sys.argv[2]
ctx = ssl.create_default_context(cafile=cafile)
url = f"wss://localhost:{port}/?protocol=wc&version=2"
topic = "ab" * 32


def call(ws, id_, method, params):
    ws.send(json.dumps({"id": id_, "jsonrpc": "2.0", "method": method, "params": params}))
    answer = json.loads(ws.recv(timeout=10))
    assert answer["id"] == id_, answer
    return answer


with connect(url, ssl=ctx) as sub, connect(url, ssl=ctx) as pub:
    sub_id = call(sub, 1, "waku_subscribe", {"topic": topic})["result"]
    assert call(pub, 2, "waku_publish", {"topic": topic, "message": "over wss", "ttl": 86400})["result"] is True
    push = json.loads(sub.recv(timeout=10))
    assert push["method"] == "waku_subscription", push
    assert push["params"]["id"] == sub_id, push
    assert push["params"]["data"]["topic"] == topic, push
    assert push["params"]["data"]["message"] == "over wss", push
    sub.send(json.dumps({"id": push["id"], "jsonrpc": "2.0", "result": True}))
    print("ok", sub_id)
