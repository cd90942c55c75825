#!/usr/bin/env node
// Compares two renders of one kustomize target (multi-document YAML made by
// two kustomize versions, e.g. Debian 12's kubectl 1.20 = kustomize 2.0.3 and
// a current kubectl) and exits 1 unless they hold the same objects.
// "The same" ignores only what differs between kustomize versions without
// changing what Kubernetes stores:
//  - the order of the documents (compared by kind/namespace/name);
//  - the content-hash suffix of generated ConfigMap names (each version
//    hashes differently), wherever the name appears;
//  - empty maps and lists (2.0.3 writes `annotations: {}` and
//    `initContainers: []` where a patch emptied them);
//  - the order of items in lists whose items all carry a `name` (volumes,
//    containers, ports, volumeMounts, env: merge-keyed lists that Kubernetes
//    treats as sets keyed by name; strategic merge orders them differently).
// usage: node same_objects.js RENDER_A.yaml RENDER_B.yaml
"use strict";

const fs = require("fs");
const YAML = require("yaml");

function load(file) {
  const objects = new Map();
  for (const doc of YAML.parseAllDocuments(fs.readFileSync(file, "utf8"))) {
    if (doc.errors.length > 0) throw new Error(`${file}: ${doc.errors[0].message}`);
    const obj = doc.toJS();
    if (obj === null || obj === undefined) continue;
    const meta = obj.metadata || {};
    const key = `${obj.kind}/${meta.namespace || ""}/${stripHash(meta.name || "")}`;
    if (objects.has(key)) throw new Error(`${file}: ${key} appears twice`);
    objects.set(key, normalize(obj));
  }
  return objects;
}

// pdserve-flags-2cm274c77c -> pdserve-flags-HASH (kustomize's suffix is 10
// characters of [a-z0-9] after the last dash).
function stripHash(s) {
  return typeof s === "string" ? s.replace(/^(pdserve-[a-z-]*flags)-[a-z0-9]{10}$/, "$1-HASH") : s;
}

function isEmpty(v) {
  return (Array.isArray(v) && v.length === 0) ||
         (v !== null && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length === 0);
}

function normalize(v) {
  if (Array.isArray(v)) {
    const items = v.map(normalize);
    const named = items.length > 0 &&
                  items.every((x) => x !== null && typeof x === "object" && typeof x.name === "string");
    if (named) items.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    return items;
  }
  if (v !== null && typeof v === "object") {
    const out = {};
    for (const k of Object.keys(v).sort()) {
      const x = normalize(v[k]);
      if (!isEmpty(x)) out[k] = x;
    }
    return out;
  }
  return stripHash(v);
}

function main() {
  const [fileA, fileB] = process.argv.slice(2);
  if (!fileA || !fileB) {
    console.error("usage: node same_objects.js RENDER_A.yaml RENDER_B.yaml");
    process.exit(2);
  }
  const a = load(fileA);
  const b = load(fileB);
  const problems = [];
  for (const key of a.keys()) {
    if (!b.has(key)) problems.push(`${key}: only in ${fileA}`);
  }
  for (const [key, objB] of b) {
    if (!a.has(key)) {
      problems.push(`${key}: only in ${fileB}`);
    } else if (JSON.stringify(a.get(key)) !== JSON.stringify(objB)) {
      problems.push(`${key}: differs\n  ${fileA}: ${JSON.stringify(a.get(key))}\n  ${fileB}: ${JSON.stringify(objB)}`);
    }
  }
  if (problems.length > 0) {
    for (const p of problems) console.error(p);
    process.exit(1);
  }
  console.log(`same ${a.size} objects`);
}

main();
