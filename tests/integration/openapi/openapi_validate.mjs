// openapi_validate.mjs DOC GATEWAY_PROTO: validates the gateway's
// OpenAPI document DOC with @apidevtools/swagger-parser (the OpenAPI 3
// schema, then its own checks: $refs resolve, operation ids unique, path
// parameters declared), then checks that every rpc of the Gateway
// service in GATEWAY_PROTO has POST /v1/rpc/<Method> with operationId
// <Method>, a request body and a 200 reply by $ref. Exit 1 on the first
// group of failures, naming each.
import SwaggerParser from "@apidevtools/swagger-parser";
import fs from "node:fs";

const [docPath, protoPath] = process.argv.slice(2);
const doc = JSON.parse(fs.readFileSync(docPath, "utf8"));
let failed = 0;
const fail = (msg) => {
	console.log(`FAIL - ${msg}`);
	failed++;
};

try {
	// validate() dereferences what it is given: hand it a copy.
	const api = await SwaggerParser.validate(structuredClone(doc));
	console.log(`ok - swagger-parser validates the document (OpenAPI ${api.openapi}, ${Object.keys(api.paths).length} paths)`);
} catch (e) {
	fail(`swagger-parser refuses the document: ${e.message}`);
}

// The methods as the .proto declares them, not as the gateway thinks.
const proto = fs.readFileSync(protoPath, "utf8");
const svc = proto.match(/service\s+Gateway\s*\{([\s\S]*?)\n\}/);
const methods = svc ? [...svc[1].matchAll(/^\s*rpc\s+(\w+)\s*\(/gm)].map((m) => m[1]) : [];
if (methods.length < 10)
	fail(`found only ${methods.length} rpcs of service Gateway in ${protoPath}`);
for (const m of methods) {
	const op = doc.paths?.[`/v1/rpc/${m}`]?.post;
	if (!op) {
		fail(`${m} has no operation POST /v1/rpc/${m}`);
		continue;
	}
	if (op.operationId !== m)
		fail(`POST /v1/rpc/${m} has operationId ${op.operationId}, not ${m}`);
	if (!op.requestBody?.content?.["application/json"]?.schema?.$ref)
		fail(`${m} has no request body schema`);
	if (!op.responses?.["200"]?.content?.["application/json"]?.schema?.$ref)
		fail(`${m} has no 200 reply schema`);
}
if (doc.paths?.["/v1/rpc/{id}"])
	fail("the generic /v1/rpc/{id} is still documented beside the per-method paths");
if (failed === 0)
	console.log(`ok - all ${methods.length} Gateway methods have their operation`);
process.exit(failed ? 1 : 0);
