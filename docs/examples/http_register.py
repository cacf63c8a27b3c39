#!/usr/bin/env python3
"""Register one instance with a regnode over HTTP and keep it registered.

Standard library only. Registers (POST /api/v1/services/S/instances), renews
the lease every third of its TTL (POST .../ID/keepalive, the secret in the
X-Registration-Secret header), registers again with the same secret when the
lease was lost (the record comes back with the state it had), and on SIGTERM
or SIGINT deregisters (DELETE .../ID) and exits 0.

    python3 http_register.py --regnode http://127.0.0.1:7401 \\
        --service orders --id orders-1 --address 127.0.0.1:8081 \\
        --ttl 10s --meta metrics_port=9100 --check http:/healthz

With regnode --auth, put a register token in $REGISTRY_TOKEN. The secret is
kept in memory only and never printed.
"""

import argparse
import json
import os
import signal
import sys
import threading
import urllib.error
import urllib.request


def parse_seconds(ttl):
    """The seconds of a Go duration of the simple kind: 10s, 1m, 1m30s, 500ms."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    total, num = 0.0, ""
    i = 0
    while i < len(ttl):
        c = ttl[i]
        if c.isdigit() or c == ".":
            num += c
            i += 1
            continue
        unit = "ms" if ttl.startswith("ms", i) else c
        if unit not in units or not num:
            raise ValueError("not a duration: %r" % ttl)
        total += float(num) * units[unit]
        num = ""
        i += len(unit)
    if num:
        raise ValueError("not a duration (unit missing): %r" % ttl)
    return total


class Registration:
    """One instance's registration through one regnode's HTTP API."""

    def __init__(self, base, service, body, token=None, timeout=5.0):
        self.base = base.rstrip("/")
        self.service = service
        self.body = body
        self.token = token
        self.timeout = timeout
        self.secret = None
        self.ttl = None

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.secret:
            req.add_header("X-Registration-Secret", self.secret)
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, {"error": raw.decode(errors="replace")}

    def _instance_path(self):
        return "/api/v1/services/%s/instances/%s" % (self.service, self.body["id"])

    def register(self):
        """Registers (again, with the same secret, if registered before)."""
        code, ans = self._call("POST", "/api/v1/services/%s/instances" % self.service, self.body)
        if code != 201:
            raise RuntimeError("register: %d %s" % (code, ans))
        self.secret = ans["secret"]
        self.ttl = ans["ttl_seconds"]
        return ans

    def keepalive(self):
        """Renews the lease; registers again if it was lost (404)."""
        code, ans = self._call("POST", self._instance_path() + "/keepalive")
        if code == 404:
            log("lease lost (%s); registering again" % ans.get("error"))
            return self.register()
        if code != 200:
            raise RuntimeError("keepalive: %d %s" % (code, ans))
        return ans

    def deregister(self):
        code, ans = self._call("DELETE", self._instance_path())
        if code not in (200, 204, 404):
            raise RuntimeError("deregister: %d %s" % (code, ans))
        return ans


def log(msg):
    print("http_register: " + msg, file=sys.stderr, flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--regnode", default="http://127.0.0.1:7401", help="regnode's HTTP port (--metrics-listen)")
    p.add_argument("--service", required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--address", required=True, help="host:port of the instance")
    p.add_argument("--ttl", default="10s", help="lease TTL, 2s..1h (default 10s)")
    p.add_argument("--weight", type=int)
    p.add_argument("--zone")
    p.add_argument("--version")
    p.add_argument("--meta", action="append", default=[], help="metadata key=value (repeatable)")
    p.add_argument("--check", help="tcp, http:PATH, grpc[:SERVICE] or none")
    args = p.parse_args(argv)

    body = {"id": args.id, "address": args.address, "ttl": args.ttl}
    for key in ("weight", "zone", "version", "check"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.meta:
        body["metadata"] = dict(kv.split("=", 1) for kv in args.meta)
    parse_seconds(args.ttl)  # a typo fails here, before anything is sent

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    reg = Registration(args.regnode, args.service, body, token=os.environ.get("REGISTRY_TOKEN"))
    ans = reg.register()
    # One line on stdout that a supervisor (or a test) can wait for.
    print(json.dumps({"registered": "%s/%s" % (args.service, args.id), "lease_id": ans["lease_id"],
                      "ttl_seconds": ans["ttl_seconds"]}), flush=True)
    while not stop.wait(reg.ttl / 3.0):
        try:
            reg.keepalive()
        except (OSError, RuntimeError) as e:
            # The regnode may be restarting: try again at the next tick,
            # well within the TTL.
            log("keepalive failed: %s" % e)
    try:
        reg.deregister()
        log("deregistered %s/%s" % (args.service, args.id))
    except (OSError, RuntimeError) as e:
        log("deregister failed (the lease expires by itself): %s" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
