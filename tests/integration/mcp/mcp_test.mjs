// The MCP TypeScript SDK client against moat's MCP server, over stdio
// (`moat mcp`) and Streamable HTTP (the gateway's /mcp): lists the tools,
// runs code, writes and reads a file, checks the error paths, and (with
// the gateway at mcp-max-sessions 1, mcp-idle-s 0: mcp_test.sh) that an
// evicted session's sandbox is destroyed with that session's own key.
// Prints "ok - ..." / "FAIL - ..." lines; exits 1 when anything failed.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { readFileSync } from "node:fs";

let failed = 0;
const check = (cond, what) => {
  console.log(`${cond ? "ok" : "FAIL"} - ${what}`);
  if (!cond) failed++;
};
const text = (r) => (r.content || []).map((c) => c.text || "").join("");

async function exercise(name, client, hostFiles) {
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  for (const t of ["run_code", "exec", "read_file", "write_file", "list_dir",
    "sandbox_create", "sandbox_list", "sandbox_destroy", "snapshot",
    "restore", "history", "fork", "diff"])
    check(names.includes(t), `${name}: tools/list has ${t}`);
  check(names.includes("upload_file") === hostFiles,
    `${name}: upload_file offered only with --allow-dir (${hostFiles})`);
  const rc = tools.find((t) => t.name === "run_code");
  check(rc && rc.inputSchema.type === "object" &&
    rc.inputSchema.required.includes("code"), `${name}: run_code schema`);

  const r = await client.callTool({ name: "run_code",
    arguments: { code: "print(6*7)" } });
  check(!r.isError && text(r).trim() === "42",
    `${name}: run_code print(6*7) -> '${text(r).trim()}'`);
  const r2 = await client.callTool({ name: "run_code",
    arguments: { code: "x = 5" } });
  const r3 = await client.callTool({ name: "run_code",
    arguments: { code: "print(x * 2)" } });
  check(!r2.isError && text(r3).trim() === "10",
    `${name}: the context keeps state (${text(r3).trim()})`);

  const w = await client.callTool({ name: "write_file",
    arguments: { path: "/root/mcp/note.txt", content: `hello ${name}\n` } });
  check(!w.isError, `${name}: write_file (${text(w)})`);
  const rd = await client.callTool({ name: "read_file",
    arguments: { path: "/root/mcp/note.txt" } });
  check(!rd.isError && text(rd) === `hello ${name}\n`,
    `${name}: read_file gives back what was written`);
  const ex = await client.callTool({ name: "exec",
    arguments: { command: "cat /root/mcp/note.txt; exit 3" } });
  check(ex.structuredContent && ex.structuredContent.exitCode === 3 &&
    text(ex).includes(`hello ${name}`), `${name}: exec output and exit code`);

  const bad = await client.callTool({ name: "read_file", arguments: {} });
  check(bad.isError && text(bad).includes("path"),
    `${name}: a missing argument is an isError result naming it`);
  const nf = await client.callTool({ name: "read_file",
    arguments: { path: "/root/no-such-file" } });
  check(nf.isError && /NOT_FOUND|no-such-file/.test(text(nf)),
    `${name}: a missing file is an isError result`);
  let code = 0;
  try {
    await client.callTool({ name: "no_such_tool", arguments: {} });
  } catch (e) {
    code = e.code;
  }
  check(code === -32602, `${name}: unknown tool -> -32602 (${code})`);

  const h = await client.callTool({ name: "history", arguments: {} });
  check(!h.isError && /exit/.test(text(h)),
    `${name}: history lists the recorded steps`);

  if (hostFiles) {
    // Travel: snapshot after a step, change the file, restore that step.
    await client.callTool({ name: "exec",
      arguments: { command: "echo one > /root/a.txt" } });
    const sn = await client.callTool({ name: "snapshot", arguments: {} });
    check(!sn.isError, `${name}: snapshot (${text(sn)})`);
    await client.callTool({ name: "exec",
      arguments: { command: "echo two > /root/a.txt" } });
    const hist = await client.callTool({ name: "history", arguments: {} });
    const snapped = (hist.structuredContent?.steps || [])
      .filter((s) => s.snapshotId).map((s) => Number(s.index));
    check(snapped.length > 0, `${name}: history shows the snapshotted step`);
    const rs = await client.callTool({ name: "restore",
      arguments: { step: snapped[snapped.length - 1] } });
    check(!rs.isError, `${name}: restore (${text(rs)})`);
    const ra = await client.callTool({ name: "read_file",
      arguments: { path: "/root/a.txt" } });
    check(text(ra) === "one\n",
      `${name}: the file is as it was at that step (${text(ra).trim()})`);

    const up = await client.callTool({ name: "upload_file",
      arguments: { host_path: "in.txt", path: "/root/in.txt" } });
    const back = await client.callTool({ name: "read_file",
      arguments: { path: "/root/in.txt" } });
    check(!up.isError && text(back) === "from the host\n",
      `${name}: upload_file from --allow-dir`);
    const down = await client.callTool({ name: "download_file",
      arguments: { path: "/root/mcp/note.txt", host_path: "out.txt" } });
    check(!down.isError && readFileSync(`${process.env.MCP_HOST_DIR}/out.txt`,
      "utf8") === `hello ${name}\n`, `${name}: download_file into --allow-dir`);
    const esc = await client.callTool({ name: "upload_file",
      arguments: { host_path: "../../etc/passwd", path: "/root/x" } });
    check(esc.isError && /refused|outside/.test(text(esc)),
      `${name}: a path leaving --allow-dir is refused`);
  }
}

async function main() {
  const stdio = new StdioClientTransport({
    command: process.env.MOAT_CLI,
    args: ["mcp", "--allow-dir", process.env.MCP_HOST_DIR],
    env: { ...process.env },
    stderr: "inherit",
  });
  const c1 = new Client({ name: "moat-test", version: "1.0.0" });
  await c1.connect(stdio);
  check(c1.getServerVersion()?.name === "moat", "stdio: initialize");
  await exercise("stdio", c1, true);
  await c1.close();

  const bearer = { authorization: `Bearer ${process.env.MOAT_API_KEY}` };
  const http = new StreamableHTTPClientTransport(new URL(process.env.MCP_URL),
    { requestInit: { headers: bearer } });
  const c2 = new Client({ name: "moat-test", version: "1.0.0" });
  await c2.connect(http);
  check(typeof http.sessionId === "string" && http.sessionId.length > 0,
    `http: initialize issued a session id (${http.sessionId})`);
  await exercise("http", c2, false);
  await http.terminateSession();
  check(http.sessionId === undefined, "http: DELETE ended the session");
  await c2.close();

  // Raw HTTP: errors of the transport itself.
  const url = process.env.MCP_URL;
  const g = await fetch(url, { method: "GET",
    headers: { accept: "text/event-stream", ...bearer } });
  check(g.status === 405, `http: GET /mcp -> 405 (${g.status})`);
  // With keys on, no key is 401 before the body is read: no session.
  const anon = await fetch(url, { method: "POST",
    headers: { "content-type": "application/json",
      accept: "application/json, text/event-stream" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize",
      params: { protocolVersion: "2025-03-26", capabilities: {},
        clientInfo: { name: "anon", version: "0" } } }) });
  check(anon.status === 401 &&
    (anon.headers.get("www-authenticate") || "").startsWith("Bearer") &&
    !anon.headers.get("mcp-session-id"),
    `http: initialize without a key -> 401 + WWW-Authenticate (${anon.status})`);
  const post = (body, headers = {}) => fetch(url, { method: "POST",
    headers: { "content-type": "application/json",
      accept: "application/json, text/event-stream", ...bearer, ...headers },
    body });
  const nosess = await post(JSON.stringify({ jsonrpc: "2.0", id: 1,
    method: "tools/list" }));
  check(nosess.status === 400, `http: no Mcp-Session-Id -> 400 (${nosess.status})`);
  const gone = await post(JSON.stringify({ jsonrpc: "2.0", id: 1,
    method: "tools/list" }), { "mcp-session-id": "0123" });
  check(gone.status === 404, `http: unknown session -> 404 (${gone.status})`);
  const junk = await post("{junk");
  const jj = await junk.json();
  check(junk.status === 400 && jj.error.code === -32700,
    `http: malformed JSON -> -32700`);
  const init = await post(JSON.stringify({ jsonrpc: "2.0", id: 1,
    method: "initialize", params: { protocolVersion: "2024-11-05",
      capabilities: {}, clientInfo: { name: "raw", version: "0" } } }));
  const ij = await init.json();
  const sid = init.headers.get("mcp-session-id");
  check(ij.result.protocolVersion === "2024-11-05" && sid,
    "http: initialize answers with the client's version");
  const note = await post(JSON.stringify({ jsonrpc: "2.0",
    method: "notifications/initialized" }), { "mcp-session-id": sid });
  check(note.status === 202, `http: a notification -> 202 (${note.status})`);
  const um = await post(JSON.stringify({ jsonrpc: "2.0", id: 2,
    method: "resources/list" }), { "mcp-session-id": sid });
  check((await um.json()).error.code === -32601, "http: unknown method -> -32601");
  const del = await fetch(url, { method: "DELETE",
    headers: { "mcp-session-id": sid, ...bearer } });
  check(del.status === 204, `http: DELETE -> 204 (${del.status})`);

  // The caller's auth reaches the gateway: a wrong key is refused there.
  // A key the gateway refuses: 401 at initialize, before the body is
  // read, and no session is made.
  const init2 = await post(JSON.stringify({ jsonrpc: "2.0", id: 1,
    method: "initialize", params: { protocolVersion: "2025-06-18",
      capabilities: {}, clientInfo: { name: "raw", version: "0" } } }),
  { authorization: "Bearer not-a-key" });
  check(init2.status === 401 && !init2.headers.get("mcp-session-id"),
    `http: a bad API key gets no session (${init2.status})`);
  // A session answers only the key it was initialized with.
  const other = { authorization: `Bearer ${process.env.MOAT_API_KEY_OTHER}` };
  const init3 = await post(JSON.stringify({ jsonrpc: "2.0", id: 1,
    method: "initialize", params: { protocolVersion: "2025-06-18",
      capabilities: {}, clientInfo: { name: "raw", version: "0" } } }));
  const sid2 = init3.headers.get("mcp-session-id");
  const stolen = await post(JSON.stringify({ jsonrpc: "2.0", id: 3,
    method: "tools/list" }), { "mcp-session-id": sid2, ...other });
  check(stolen.status === 404,
    `http: a session id with another key is not found (${stolen.status})`);
  const del2 = await fetch(url, { method: "DELETE",
    headers: { "mcp-session-id": sid2, ...bearer } });
  check(del2.status === 204, `http: its own caller ends it (${del2.status})`);

  // Eviction (mcp-max-sessions 1, mcp-idle-s 0): session A makes its
  // sandbox; B, initialized with another tenant's key (which cannot
  // reach A's sandbox), evicts A. A's sandbox goes only if the eviction
  // destroyed it with A's own key.
  const initBody = JSON.stringify({ jsonrpc: "2.0", id: 1,
    method: "initialize", params: { protocolVersion: "2025-06-18",
      capabilities: {}, clientInfo: { name: "raw", version: "0" } } });
  const mcpOf = async (sid) => {
    const l = await fetch(new URL("/v1/sandboxes", url), { headers: bearer });
    const lj = await l.json();
    return (lj.sandboxes || []).filter((s) =>
      (s.labels || {})["mcp-session"] === sid);
  };
  const ia = await post(initBody);
  const sidA = ia.headers.get("mcp-session-id");
  check(ia.status === 200 && sidA,
    `http: session A initialized (${ia.status})`);
  const ra = await post(JSON.stringify({ jsonrpc: "2.0", id: 2,
    method: "tools/call", params: { name: "run_code",
      arguments: { code: "print(6*7)" } } }), { "mcp-session-id": sidA });
  const raj = await ra.json();
  check(raj.result && !raj.result.isError && text(raj.result).trim() === "42",
    `http: session A runs code (${text(raj.result || {}).trim()})`);
  check((await mcpOf(sidA)).length === 1,
    "http: session A's sandbox is labelled mcp-session=A");
  const ib = await post(initBody, other);
  const sidB = ib.headers.get("mcp-session-id");
  check(ib.status === 200 && sidB && sidB !== sidA,
    `http: session B evicts A from the full table (${ib.status})`);
  const evicted = await post(JSON.stringify({ jsonrpc: "2.0", id: 3,
    method: "tools/list" }), { "mcp-session-id": sidA });
  check(evicted.status === 404,
    `http: the evicted session is not found (${evicted.status})`);
  const leftA = await mcpOf(sidA);
  check(leftA.length === 0,
    `http: the evicted session's sandbox was destroyed with its own key ` +
    `(${leftA.map((s) => s.id).join(", ") || "none left"})`);
  const delB = await fetch(url, { method: "DELETE",
    headers: { "mcp-session-id": sidB, ...other } });
  check(delB.status === 204, `http: B ends (${delB.status})`);
}

try {
  await main();
} catch (e) {
  console.log(`FAIL - ${e.stack || e}`);
  failed++;
}
console.log(failed ? `${failed} failed` : "all passed");
process.exit(failed ? 1 : 0);
