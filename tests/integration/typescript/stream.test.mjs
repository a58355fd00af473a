// The SDK's ExecStream path, which the gateway does not serve yet: a
// Gateway of this file's own (connect-node's server adapter, serving
// GetSandbox and ExecStream only) over HTTP/1.1 for Connect and gRPC-Web
// and over h2c for gRPC. commands.run must take the stream's chunks in
// order and its exit status, and a stream that fails for a real reason
// (NotFound) must stay that error rather than fall back to polls. No VM.
// Not for: the fallback or the real gateway (sdk.test.mjs).
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import http2 from "node:http2";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { Code, ConnectError } from "@connectrpc/connect";
import { Sandbox, Client, Gateway, NotFoundError } from "../dist/src/index.js";

const enc = new TextEncoder();
const seen = [];

const adapter = connectNodeAdapter({
  routes(router) {
    router.service(Gateway, {
      getSandbox(req) {
        return { id: req.sandboxId, sessionId: "" };
      },
      async *execStream(req, ctx) {
        seen.push({ shell: req.shell, auth: ctx.requestHeader.get("authorization") });
        if (req.sandboxId === "sb-gone") throw new ConnectError("no sandbox sb-gone", Code.NotFound);
        yield { event: { case: "started", value: { sandboxId: req.sandboxId, execId: 7n, pid: 42 } } };
        yield { event: { case: "stdout", value: enc.encode("line1\n") } };
        // A character split between two chunks stays whole.
        yield { event: { case: "stderr", value: enc.encode("é").subarray(0, 1) } };
        yield { event: { case: "stderr", value: enc.encode("é").subarray(1) } };
        yield { event: { case: "stdout", value: enc.encode("line2\n") } };
        yield { event: { case: "exit", value: { exited: true, exitCode: 3, execId: 7n } } };
      },
    });
  },
});

function listen(server) {
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(`http://127.0.0.1:${server.address().port}`)));
}

const h1 = http.createServer(adapter);
const h2 = http2.createServer(adapter);
// The clients keep their connections (HTTP/1.1 keep-alive, an HTTP/2
// session): closed by the server at the end, or the process never ends.
const sessions = new Set();
h2.on("session", (s) => {
  sessions.add(s);
  s.on("close", () => sessions.delete(s));
});
const url1 = await listen(h1);
const url2 = await listen(h2);

test.after(() => {
  h1.closeAllConnections();
  h1.close();
  for (const s of sessions) s.destroy();
  h2.close();
});

for (const [protocol, url] of [["connect", url1], ["grpc-web", url1], ["grpc", url2]]) {
  test(`ExecStream over ${protocol}`, async () => {
    const client = new Client({ protocol, url, apiKey: "k1" });
    const sb = await Sandbox.connect("sb-x", { client });
    const out = [];
    const err = [];
    const r = await sb.commands.run(`echo ${protocol}`, { onStdout: (d) => out.push(d), onStderr: (d) => err.push(d) });
    assert.equal(r.via, "stream");
    assert.deepEqual(out, ["line1\n", "line2\n"]);
    assert.equal(err.join(""), "é");
    assert.equal(r.exitCode, 3);
    assert.equal(r.stdout, "line1\nline2\n");
    assert.equal(client.streamServed, true);
    assert.deepEqual(seen.at(-1), { shell: `echo ${protocol}`, auth: "Bearer k1" });

    // A real failure of the stream is that error, never a fallback.
    const gone = await Sandbox.connect("sb-gone", { client });
    await assert.rejects(gone.commands.run("true", { onStdout: () => {} }), NotFoundError);
  });
}

test("via: stream refuses the fallback where ExecStream is not served", async () => {
  const other = http.createServer(connectNodeAdapter({ routes: (r) => r.service(Gateway, { getSandbox: (req) => ({ id: req.sandboxId }) }) }));
  const url = await listen(other);
  try {
    const client = new Client({ url });
    const sb = await Sandbox.connect("sb-x", { client });
    await assert.rejects(sb.commands.run("true", { onStdout: () => {}, via: "stream" }), (e) => e.code === "Unimplemented");
  } finally {
    other.closeAllConnections();
    other.close();
  }
});
