// specproxy.mjs stands between the kit's clients and `tailgate up` and
// records every exchange for schema.mjs to validate against the published
// OpenAPI specs (testdata/openapi). It passes bytes through as they come,
// both ways, so streams stay streams and an aborted client aborts the
// request upstream (the abort cells still see what the gateway bills).
// Stoplight Prism's proxy cannot stand here: its forwarder reads the whole
// upstream body before answering (stoplightio/prism,
// packages/http/src/forwarder/index.ts and utils/parseResponse.ts), which
// would turn every stream into one late answer.
//
//   node specproxy.mjs UPSTREAM RECORDS PORTFILE
//
// listens on a free loopback port (written to PORTFILE), forwards to
// UPSTREAM (http://127.0.0.1:PORT), appends one JSON line per exchange to
// RECORDS: {client, method, path, status, reqType, req, resType, res,
// complete}. POST /_kit/row with a client's name as the body tags the
// exchanges that follow with it (the kit's rows run one after another).
import http from "node:http";
import { appendFileSync, writeFileSync } from "node:fs";

const [upstream, records, portFile] = process.argv.slice(2);
const up = new URL(upstream);
const LIMIT = 4 << 20; // bytes of a body kept for validation
let client = "";

const server = http.createServer((req, res) => {
  if (req.method === "POST" && req.url === "/_kit/row") {
    let b = "";
    req.on("data", (c) => (b += c));
    req.on("end", () => {
      client = b.trim();
      res.end("ok");
    });
    return;
  }
  const rec = { client, method: req.method, path: req.url, reqType: req.headers["content-type"] || "" };
  const reqBody = [];
  const resBody = [];
  const keep = (arr, c) => {
    arr.kept = (arr.kept || 0) + c.length;
    if (arr.kept <= LIMIT) arr.push(c);
  };
  const headers = { ...req.headers, host: up.host };
  const ureq = http.request({ host: up.hostname, port: up.port, method: req.method, path: req.url, headers });
  let done = false;
  const finish = (complete) => {
    if (done) return;
    done = true;
    rec.complete = complete;
    rec.req = Buffer.concat(reqBody).toString("utf8");
    rec.res = Buffer.concat(resBody).toString("utf8");
    appendFileSync(records, JSON.stringify(rec) + "\n");
  };
  ureq.on("response", (ures) => {
    rec.status = ures.statusCode;
    rec.resType = ures.headers["content-type"] || "";
    res.writeHead(ures.statusCode, ures.statusMessage, ures.rawHeaders);
    res.flushHeaders();
    ures.on("data", (c) => {
      keep(resBody, c);
      res.write(c);
    });
    ures.on("end", () => {
      res.end();
      finish(true);
    });
    ures.on("error", () => {
      res.destroy();
      finish(false);
    });
  });
  ureq.on("error", (e) => {
    if (!res.headersSent) {
      res.writeHead(502, { "content-type": "text/plain" });
      res.end(`specproxy: ${e.message}`);
    } else res.destroy();
    finish(false);
  });
  // The client went away (an aborted stream): so does the upstream request.
  res.on("close", () => {
    if (!res.writableFinished) {
      ureq.destroy();
      finish(false);
    }
  });
  req.on("data", (c) => {
    keep(reqBody, c);
    ureq.write(c);
  });
  req.on("end", () => ureq.end());
});
server.keepAliveTimeout = 60000;
server.listen(0, "127.0.0.1", () => writeFileSync(portFile, String(server.address().port)));
