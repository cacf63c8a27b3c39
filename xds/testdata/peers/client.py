"""An xDS client of the registry in Python, for xds/peers_test.go.

grpcio's own xDS support (C-core) with nothing but a bootstrap file
($GRPC_XDS_BOOTSTRAP): it calls grpc.health.v1.Health/Check through
xds:///SERVICE (SERVICE is argv[1]). Each line "call N" on stdin makes N
calls; it answers one JSON line {"OK": n, "Failed": n, "Err": "last error"}.

The health request and response go as raw bytes (the empty request is
b''), so neither grpc_health nor generated code is needed: Debian's
python3-grpcio is enough. Run it with /usr/bin/python3, which sees
Debian's dist-packages.
"""

import json
import sys

import grpc


def main():
    service = sys.argv[1]
    channel = grpc.insecure_channel("xds:///" + service)
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    for line in sys.stdin:
        words = line.split()
        if len(words) != 2 or words[0] != "call":
            continue
        report = {"OK": 0, "Failed": 0, "Err": ""}
        for _ in range(int(words[1])):
            try:
                check(b"", timeout=10, wait_for_ready=True)
                report["OK"] += 1
            except grpc.RpcError as e:
                report["Failed"] += 1
                report["Err"] = "%s: %s" % (e.code(), e.details())
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
    channel.close()


if __name__ == "__main__":
    main()
