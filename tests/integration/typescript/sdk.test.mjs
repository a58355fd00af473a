// The TypeScript SDK (clients/typescript, compiled by
// typescript_test.sh) against a real stack, under node's own test runner:
// commands with streamed output (ExecStream, and the ExecStart + ExecRead
// fallback forced), code runs in a context, files, a recorded sandbox's
// history/restore/fork (a branch's steps numbered on from its parent's,
// its tree), kill, a wrong key, and the same calls over the
// Connect, gRPC and gRPC-Web transports. Not for: the gateway's protocol
// details (tests/unit/http, tests/integration/grpc).
// Run from the compiled SDK's test/ directory (typescript_test.sh copies
// it there). Environment: MOAT_URL, MOAT_GRPC_URL, MOAT_API_KEY.
import { test } from "node:test";
import assert from "node:assert/strict";

import { Sandbox, Client, MoatError, NotFoundError, AuthError } from "../dist/src/index.js";

const shape = { memoryMib: 256 };

test("commands, code, files in one sandbox", async (t) => {
  const sb = await Sandbox.create({ ...shape, record: false, snapshot: "none" });
  t.after(() => sb.kill());
  assert.match(sb.id, /\S/);

  await t.test("commands.run streams line1, line2 in order to onStdout", async () => {
    const chunks = [];
    const errs = [];
    const r = await sb.commands.run("echo line1; echo oops >&2; echo line2", {
      onStdout: (d) => chunks.push(d),
      onStderr: (d) => errs.push(d),
    });
    assert.equal(chunks.join(""), "line1\nline2\n");
    assert.equal(errs.join(""), "oops\n");
    assert.equal(r.stdout, "line1\nline2\n");
    assert.equal(r.exitCode, 0);
    assert.ok(["stream", "poll"].includes(r.via), r.via);
    t.diagnostic(`commands.run streamed via ${r.via} (poll: the door does not serve ExecStream yet)`);
  });

  await t.test("the ExecStart + ExecRead fallback, forced, gives the same", async () => {
    const chunks = [];
    const r = await sb.commands.run("echo line1; echo line2; exit 3", { onStdout: (d) => chunks.push(d), via: "poll" });
    assert.equal(r.via, "poll");
    assert.equal(chunks.join(""), "line1\nline2\n");
    assert.equal(r.exitCode, 3);
  });

  await t.test("exit 3 is exit code 3; cwd and env reach the command", async () => {
    const r = await sb.commands.run("exit 3");
    assert.equal(r.exitCode, 3);
    assert.equal(r.via, "exec");
    const e = await sb.commands.run('pwd; echo "$A"', { cwd: "/tmp", env: { A: "from-env" } });
    assert.equal(e.stdout, "/tmp\nfrom-env\n");
    const s = await sb.commands.run("exit 4", { onStderr: () => {} });
    assert.equal(s.exitCode, 4);
  });

  await t.test("runCode: 6*7 is 42, variables stay in a context", async () => {
    const r = await sb.runCode("6*7", { language: "python" });
    assert.equal(r.result, "42");
    assert.equal(r.error, undefined);
    await sb.runCode("x = 20", { context: "c1" });
    const x = await sb.runCode("x + 1", { context: "c1" });
    assert.equal(x.result, "21");
    const other = await sb.runCode("x", { context: "c2" });
    assert.equal(other.error?.name, "NameError");
  });

  await t.test("files: binary round trip, list, remove", async () => {
    const bytes = new Uint8Array(256 * 3);
    for (let i = 0; i < bytes.length; i++) bytes[i] = i % 256;
    const info = await sb.files.write("/root/d/bin.dat", bytes);
    assert.equal(info.size, bytes.length);
    assert.deepEqual(await sb.files.read("/root/d/bin.dat"), bytes);
    await sb.files.write("/root/d/t.txt", "hello");
    assert.equal(await sb.files.readText("/root/d/t.txt"), "hello");
    const names = (await sb.files.list("/root/d")).map((f) => `${f.name}:${f.type}`).sort();
    assert.deepEqual(names, ["bin.dat:file", "t.txt:file"]);
    await sb.files.remove("/root/d/t.txt");
    assert.equal(await sb.files.exists("/root/d/t.txt"), false);
    await assert.rejects(sb.files.read("/root/d/t.txt"), NotFoundError);
  });

  await t.test("connect(id) finds it", async () => {
    const again = await Sandbox.connect(sb.id);
    assert.equal(again.id, sb.id);
  });

  await t.test("kill, then a call is NotFoundError", async () => {
    await sb.kill();
    await assert.rejects(sb.commands.run("true"), (err) => {
      assert.ok(err instanceof NotFoundError, `${err?.name}: ${err?.message}`);
      assert.equal(err.code, "NotFound");
      assert.match(err.message, /\S/);
      return true;
    });
    await sb.kill(); // already gone: not an error
  });
});

test("a recorded sandbox: history, restore, fork", async (t) => {
  const sb = await Sandbox.create({ ...shape, record: true, snapshot: "every" });
  t.after(() => sb.kill());
  assert.match(sb.sessionId, /\S/);
  const one = await sb.commands.run("echo one > /root/one");
  assert.equal(one.step, 1);
  const two = await sb.commands.run("echo two > /root/two");
  assert.equal(two.step, 2);
  const steps = await sb.history();
  assert.deepEqual(steps.map((s) => s.index), [1, 2]);
  assert.deepEqual(steps.map((s) => s.kind), ["exec", "exec"]);
  const original = sb.sessionId;

  const restored = await sb.restore(1);
  assert.equal(restored.sandboxId, sb.id);
  assert.notEqual(sb.sessionId, original);
  assert.equal(await sb.files.exists("/root/two"), false, "step 2's file is gone");
  assert.equal(await sb.files.readText("/root/one"), "one\n");
  // The branch continues the path (issue 18): its next step is step 2,
  // and its history starts with step 1, held by the original session.
  const three = await sb.commands.run("echo three > /root/three");
  assert.equal(three.step, 2);
  const path = await sb.history({ outputs: false });
  assert.deepEqual(path.map((s) => [s.index, s.heldBySession]), [[1, original], [2, ""]]);
  const tree = await sb.tree({ sessionId: original });
  assert.equal(tree[0].sessionId, original);
  const branch = tree.find((n) => n.sessionId === sb.sessionId);
  assert.equal(Number(branch?.branchedAt), 1);
  assert.equal(Number(branch?.stepCount), 2);

  const forks = await sb.fork(1, 2, { sessionId: original });
  t.after(() => Promise.all(forks.map((f) => f.kill())));
  assert.equal(forks.length, 2, `failed copies: ${forks.failed.map(String)}`);
  assert.equal(new Set([sb.id, ...forks.map((f) => f.id)]).size, 3);
  for (const f of forks) {
    assert.equal(await f.files.readText("/root/one"), "one\n");
    assert.equal(await f.files.exists("/root/two"), false);
  }
});

test("a wrong key is AuthError", async () => {
  await assert.rejects(Sandbox.list({ apiKey: "moat_not_a_key" }), (err) => {
    assert.ok(err instanceof AuthError, `${err?.name}: ${err?.message}`);
    assert.ok(err instanceof MoatError);
    assert.equal(err.code, "Unauthenticated");
    return true;
  });
  await assert.rejects(Sandbox.list({ apiKey: "moat_not_a_key", protocol: "grpc" }), AuthError);
});

test("Connect, gRPC and gRPC-Web give the same results", async (t) => {
  const sb = await Sandbox.create({ ...shape, record: false, snapshot: "none" });
  t.after(() => sb.kill());
  const protocols = {
    connect: { url: process.env.MOAT_URL },
    "connect (JSON)": { url: process.env.MOAT_URL, binary: false },
    grpc: { url: process.env.MOAT_GRPC_URL, protocol: "grpc" },
    "grpc-web": { url: process.env.MOAT_URL, protocol: "grpc-web" },
  };
  for (const [name, opts] of Object.entries(protocols)) {
    await t.test(name, async (st) => {
      const client = new Client({ protocol: "connect", ...opts });
      let got;
      try {
        got = await Sandbox.connect(sb.id, { client });
      } catch (err) {
        // The HTTP door refuses what it does not serve (415, or 404);
        // connect-es reports that as "HTTP 415" / Unimplemented.
        if (name === "grpc-web" && err instanceof MoatError && (/^HTTP 4(04|15)$/.test(err.message) || err.code === "Unimplemented")) {
          st.skip(`gRPC-Web is not served by the HTTP door yet (${err.code}: ${err.message})`);
          return;
        }
        throw err;
      }
      assert.equal(got.id, sb.id);
      assert.equal(got.info.state, sb.info.state);
      assert.equal(got.info.nodeId, sb.info.nodeId);
      const list = await Sandbox.list({ client });
      assert.ok(list.some((s) => s.id === sb.id), `${sb.id} listed`);
      const r = await got.commands.run("echo same; exit 5");
      assert.deepEqual([r.exitCode, r.stdout], [5, "same\n"]);
      const chunks = [];
      const s = await got.commands.run("echo a; echo b", { onStdout: (d) => chunks.push(d) });
      assert.deepEqual([s.exitCode, chunks.join("")], [0, "a\nb\n"]);
      st.diagnostic(`${name}: commands.run streamed via ${s.via}`);
      await assert.rejects(Sandbox.connect("sb-0000000000000000", { client }), NotFoundError);
    });
  }
});
