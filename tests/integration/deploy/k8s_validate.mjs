// k8s_validate.mjs: validates Kubernetes manifests against the
// Kubernetes schemas of npm's kubernetes-models, and checks the Nomad job
// files parse as HCL (npm's @cdktf/hcl2json: HashiCorp's HCL parser).
// Run by k8s_test.sh from a directory whose node_modules holds
// tests/integration/deploy/package.json's packages.
//   node k8s_validate.mjs --k8s FILE.yaml... --hcl FILE.hcl...
// For each YAML document: its apiVersion/kind must be a model of
// kubernetes-models, the model's validate() must pass (types, required
// fields, enums), and every field must be one the API knows: the models'
// schemas accept unknown fields, so a misspelt one (volumeMount) would
// pass them; the model's type declarations (.d.ts) list the known ones.
// Documents of kind Kustomization are skipped (not API objects).
// Prints "ok - ..." / "FAIL - ..." lines; exits 1 on any failure.
// Not for: checks specific to moat's manifests (k8s_test.sh does those).
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { parseAllDocuments } from "yaml";

const require = createRequire(path.join(process.cwd(), "x.js"));
const modelsDir = path.dirname(require.resolve("kubernetes-models/package.json"));
const nodeModules = path.dirname(modelsDir);
let failures = 0;
const ok = (m) => console.log(`ok - ${m}`);
const fail = (m) => {
	console.log(`FAIL - ${m}`);
	failures++;
};

// ---- known fields, from the models' .d.ts files ----
const ifaceCache = new Map();

function resolveImport(from, spec) {
	let p;
	if (spec.startsWith(".")) p = path.resolve(path.dirname(from), spec);
	else p = path.join(nodeModules, spec);
	return p.replace(/\.js$/, "") + ".d.ts";
}

// The first exported interface of a .d.ts: field name -> type text, and
// the file's imports (type name -> .d.ts path).
function loadInterface(file) {
	if (ifaceCache.has(file)) return ifaceCache.get(file);
	const text = fs.readFileSync(file, "utf8");
	const imports = new Map();
	for (const m of text.matchAll(/^import \{ ([^}]+) \} from "([^"]+)";$/gm))
		for (const name of m[1].split(",").map((s) => s.trim()))
			imports.set(name, resolveImport(file, m[2]));
	const start = text.search(/^export interface I\w+[^{]*\{$/m);
	const fields = new Map();
	if (start >= 0) {
		const body = text.slice(start, text.indexOf("\n}", start));
		for (const m of body.matchAll(/^ {4}"([^"]+)"\??: (.*?);?$/gm))
			fields.set(m[1], m[2]);
	}
	const iface = { fields, imports, file };
	ifaceCache.set(file, iface);
	return iface;
}

// checkFields OBJ IFACE WHERE: every key of obj is a field of iface;
// recurses into fields whose type is another model interface.
function checkFields(obj, iface, where, errors) {
	if (obj === null || typeof obj !== "object" || Array.isArray(obj)) return;
	for (const [k, v] of Object.entries(obj)) {
		if (!iface.fields.has(k)) {
			errors.push(`${where}.${k}: unknown field (known: ${[...iface.fields.keys()].join(", ")})`);
			continue;
		}
		let t = iface.fields.get(k);
		let items = false;
		const arr = t.match(/^Array<(\w+)>$/);
		if (arr) {
			t = arr[1];
			items = true;
		}
		if (!/^\w+$/.test(t) || !iface.imports.has(t)) continue; // a leaf
		const file = iface.imports.get(t);
		if (!fs.existsSync(file)) continue;
		const sub = loadInterface(file);
		if (sub.fields.size === 0) continue; // an alias (IntOrString, Time)
		if (items && Array.isArray(v)) v.forEach((e, i) => checkFields(e, sub, `${where}.${k}[${i}]`, errors));
		else if (!items) checkFields(v, sub, `${where}.${k}`, errors);
	}
}

function modelPath(apiVersion, kind) {
	const group = apiVersion.includes("/") ? apiVersion : `${apiVersion}`;
	return path.join(modelsDir, group, `${kind}.js`);
}

async function checkK8s(file) {
	let docs;
	try {
		docs = parseAllDocuments(fs.readFileSync(file, "utf8"));
	} catch (e) {
		fail(`${file}: cannot read: ${e.message}`);
		return;
	}
	let n = 0;
	for (const doc of docs) {
		if (doc.errors.length) {
			fail(`${file}: YAML: ${doc.errors.map((e) => e.message).join("; ")}`);
			continue;
		}
		const obj = doc.toJS();
		if (obj === null || obj === undefined) continue;
		if (obj.kind === "Kustomization") {
			ok(`${path.basename(file)}: Kustomization (not an API object: skipped)`);
			continue;
		}
		n++;
		const what = `${path.basename(file)}: ${obj.kind}/${obj.metadata?.name}`;
		if (typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") {
			fail(`${file}: document ${n} has no apiVersion or kind`);
			continue;
		}
		const mp = modelPath(obj.apiVersion, obj.kind);
		if (!fs.existsSync(mp)) {
			fail(`${what}: ${obj.apiVersion} ${obj.kind} is no Kubernetes API kind (no ${path.relative(modelsDir, mp)} in kubernetes-models)`);
			continue;
		}
		const mod = await import(mp);
		const Model = mod[obj.kind];
		try {
			new Model(obj).validate();
		} catch (e) {
			fail(`${what}: ${String(e.message ?? e)}`);
			continue;
		}
		const errors = [];
		checkFields(obj, loadInterface(mp.replace(/\.js$/, ".d.ts")), obj.kind, errors);
		if (errors.length) {
			fail(`${what}: ${errors.join("; ")}`);
			continue;
		}
		ok(`${what} validates (${obj.apiVersion})`);
	}
	if (n === 0 && !docs.some((d) => d.toJS()?.kind === "Kustomization")) fail(`${file}: no Kubernetes object`);
}

async function checkHcl(file) {
	const { parse } = require("@cdktf/hcl2json");
	try {
		const json = await parse(path.basename(file), fs.readFileSync(file, "utf8"));
		fs.writeFileSync(`${file}.json`.replace(/.*\//, `${process.cwd()}/`), JSON.stringify(json, null, 1));
		ok(`${path.basename(file)} parses as HCL (${Object.keys(json.job ?? {}).map((j) => `job ${j}`).join(", ") || "no job"})`);
	} catch (e) {
		fail(`${file}: HCL: ${String(e.message ?? e)}`);
	}
}

let mode = null;
for (const a of process.argv.slice(2)) {
	if (a === "--k8s" || a === "--hcl") mode = a;
	else if (mode === "--k8s") await checkK8s(a);
	else if (mode === "--hcl") await checkHcl(a);
	else fail(`usage: node k8s_validate.mjs --k8s FILE... --hcl FILE... (got ${a})`);
}
process.exit(failures ? 1 : 0);
