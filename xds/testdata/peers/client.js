// An xDS client of the registry in Node, for xds/peers_test.go.
//
// @grpc/grpc-js with @grpc/grpc-js-xds's resolver and balancers, with
// nothing but a bootstrap file ($GRPC_XDS_BOOTSTRAP): it calls
// grpc.health.v1.Health/Check through xds:///SERVICE (SERVICE is
// process.argv[2]). Each line "call N" on stdin makes N calls, one after
// the other; it answers one JSON line {"OK": n, "Failed": n, "Err": "last
// error"}. The request and response go as raw bytes (the empty request is
// an empty buffer): no generated code.
'use strict';

const grpc = require('@grpc/grpc-js');
const grpcXds = require('@grpc/grpc-js-xds');
const readline = require('readline');

grpcXds.register();

const service = process.argv[2];
const client = new grpc.Client('xds:///' + service, grpc.credentials.createInsecure());
const raw = (b) => b;

function check() {
  return new Promise((resolve) => {
    const deadline = new Date(Date.now() + 10000);
    // Wait for ready: calls queue while the channel connects, as the Go
    // and Python peers' do.
    const md = new grpc.Metadata({ waitForReady: true });
    client.makeUnaryRequest('/grpc.health.v1.Health/Check', raw, raw, Buffer.alloc(0),
      md, { deadline }, (err) => resolve(err));
  });
}

async function main() {
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const m = /^call (\d+)$/.exec(line.trim());
    if (!m) continue;
    const report = { OK: 0, Failed: 0, Err: '' };
    for (let i = 0; i < Number(m[1]); i++) {
      const err = await check();
      if (err) {
        report.Failed++;
        report.Err = `${grpc.status[err.code]}: ${err.details}`;
      } else {
        report.OK++;
      }
    }
    process.stdout.write(JSON.stringify(report) + '\n');
  }
  client.close();
}

main().catch((e) => { console.error(e); process.exit(1); });
