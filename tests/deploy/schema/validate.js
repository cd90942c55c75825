#!/usr/bin/env node
// Offline checks of rendered Kubernetes manifests (multi-document YAML, the
// output of `kubectl kustomize`). No cluster and no schema download:
//  1. Schema: every object is validated by its model from the npm package
//     `kubernetes-models` (built-in kinds: types, required fields, enums,
//     formats) or `@kubernetes-models/prometheus-operator` (PodMonitor).
//     Unknown apiVersion/kind is an error. Limitation: these schemas allow
//     additional properties, so a misspelled optional field is not caught by
//     step 1 (a server with --validate=strict would catch it).
//  2. Consistency between objects, which no schema sees: selectors match pod
//     labels, Service/HPA/PDB/volume references resolve, probe and scrape
//     ports agree with the role's flags (read from the ConfigMap flagfiles),
//     the router's dns:/// workers are headless Services of this render,
//     terminationGracePeriodSeconds exceeds --drain_timeout_seconds, HPA pod
//     metrics are served by the Prometheus adapter rules and come from metrics
//     pdserve defines, and every pdserve Deployment has the same shared pod
//     settings (base/workloads/pod-common.yaml patches each one by name, so
//     the copies must not drift).
// usage: node validate.js [--adapter=RENDERED_ADAPTER.yaml]
//                         [--metric_defs=common/metrics/metric_defs.cc]
//                         [--dump_flagfiles=DIR] [--podman] RENDERED.yaml
// --dump_flagfiles writes every *.flags key of every ConfigMap to DIR (named
// CONFIGMAP.KEY) so that the caller can check them against the binary.
// --podman: the render is for `podman play kube` (no Services): dns:///
// worker targets must name podman's pods of a Deployment instead.
"use strict";

const fs = require("fs");
const YAML = require("yaml");

const errors = [];
function fail(where, msg) {
  errors.push(`${where}: ${msg}`);
}

function parseArgs(argv) {
  const opts = { files: [] };
  for (const a of argv) {
    if (a.startsWith("--adapter=")) opts.adapter = a.slice("--adapter=".length);
    else if (a.startsWith("--metric_defs=")) opts.metricDefs = a.slice("--metric_defs=".length);
    else if (a.startsWith("--dump_flagfiles=")) opts.dumpFlagfiles = a.slice("--dump_flagfiles=".length);
    else if (a === "--podman") opts.podman = true;
    else opts.files.push(a);
  }
  if (opts.files.length !== 1) {
    console.error("usage: node validate.js [--adapter=F] [--metric_defs=F] [--dump_flagfiles=DIR] [--podman] " +
                  "RENDERED.yaml");
    process.exit(2);
  }
  return opts;
}

function loadDocs(file) {
  const docs = [];
  for (const doc of YAML.parseAllDocuments(fs.readFileSync(file, "utf8"))) {
    if (doc.errors.length > 0) {
      fail(file, `YAML error: ${doc.errors[0].message}`);
      continue;
    }
    const obj = doc.toJS();
    if (obj !== null && obj !== undefined) docs.push(obj);
  }
  return docs;
}

// apiVersion + kind -> the model class, or null.
function modelFor(apiVersion, kind) {
  const path = apiVersion.startsWith("monitoring.coreos.com/")
    ? `@kubernetes-models/prometheus-operator/${apiVersion}/${kind}`
    : `kubernetes-models/${apiVersion}/${kind}`;
  try {
    return require(path)[kind] || null;
  } catch (e) {
    if (e.code === "MODULE_NOT_FOUND" || e.code === "ERR_PACKAGE_PATH_NOT_EXPORTED") return null;
    throw e;
  }
}

function id(obj) {
  return `${obj.kind}/${obj.metadata && obj.metadata.name}`;
}

function checkSchema(docs) {
  for (const obj of docs) {
    if (!obj.apiVersion || !obj.kind) {
      fail("document", "missing apiVersion or kind");
      continue;
    }
    const Model = modelFor(obj.apiVersion, obj.kind);
    if (!Model) {
      fail(id(obj), `no schema model for ${obj.apiVersion} ${obj.kind}`);
      continue;
    }
    try {
      new Model(obj).validate();
    } catch (e) {
      fail(id(obj), `schema: ${e.message}`);
    }
  }
}

// --- consistency ---------------------------------------------------------

function matchesSelector(labels, selector) {
  if (!selector) return false;
  labels = labels || {};
  for (const [k, v] of Object.entries(selector.matchLabels || {})) {
    if (labels[k] !== v) return false;
  }
  for (const e of selector.matchExpressions || []) {
    const has = Object.prototype.hasOwnProperty.call(labels, e.key);
    if (e.operator === "In" && !(has && e.values.includes(labels[e.key]))) return false;
    if (e.operator === "NotIn" && has && e.values.includes(labels[e.key])) return false;
    if (e.operator === "Exists" && !has) return false;
    if (e.operator === "DoesNotExist" && has) return false;
  }
  return true;
}

// Parses "--a=1\n--b=2" into a Map (later lines win, like absl flags).
function parseFlagLines(text, flags) {
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) continue;
    const m = /^--([A-Za-z0-9_]+)(?:=(.*))?$/.exec(line);
    if (m) flags.set(m[1], m[2] === undefined ? "true" : m[2]);
  }
}

// The effective flags of a container: its args, with every --flagfile read
// from the ConfigMap mounted at that path.
function containerFlags(pod, container, configMaps, where) {
  const flags = new Map();
  const mounts = new Map();
  for (const vm of container.volumeMounts || []) mounts.set(vm.mountPath, vm.name);
  const volumes = new Map((pod.volumes || []).map((v) => [v.name, v]));
  for (const arg of container.args || []) {
    const ff = /^--flagfile=(.*)$/.exec(arg);
    if (!ff) {
      parseFlagLines(arg, flags);
      continue;
    }
    for (const path of ff[1].split(",")) {
      const dir = path.slice(0, path.lastIndexOf("/"));
      const key = path.slice(path.lastIndexOf("/") + 1);
      const volume = volumes.get(mounts.get(dir));
      if (!volume || !volume.configMap) {
        fail(where, `flagfile ${path} is not in a mounted ConfigMap`);
        continue;
      }
      const cm = configMaps.get(volume.configMap.name);
      if (!cm || !cm.data || cm.data[key] === undefined) {
        fail(where, `flagfile ${path}: ConfigMap ${volume.configMap.name} has no key ${key}`);
        continue;
      }
      parseFlagLines(cm.data[key], flags);
    }
  }
  return flags;
}

// What base/workloads/pod-common.yaml gives every pdserve pod (podman renders
// rename the volumes per role, so volume names are left out there). Added
// capabilities are a role's own (overlays/gpu: IPC_LOCK on the workers, for
// RDMA registration) and left out; what is dropped must stay the same.
function sharedPodSettings(d, podman) {
  const pod = d.spec.template.spec;
  const c = pod.containers[0] || {};
  const strip = (v) => (podman ? Object.fromEntries(Object.entries(v).filter(([k]) => k !== "name")) : v);
  const withoutAdded = (sc) => {
    if (!sc || !sc.capabilities || !sc.capabilities.add) return sc;
    const caps = Object.fromEntries(Object.entries(sc.capabilities).filter(([k]) => k !== "add"));
    return {...sc, capabilities: caps};
  };
  return {
    automountServiceAccountToken: pod.automountServiceAccountToken,
    enableServiceLinks: pod.enableServiceLinks,
    securityContext: pod.securityContext,
    initContainers: (pod.initContainers || []).map((i) => ({name: i.name, command: i.command,
                                                             securityContext: i.securityContext})),
    volumes: (pod.volumes || []).map(strip),
    containerSecurityContext: withoutAdded(c.securityContext),
    volumeMounts: (c.volumeMounts || []).map((m) => m.mountPath),
  };
}

function checkConsistency(docs, opts) {
  const byKind = (k) => docs.filter((d) => d.kind === k);
  const deployments = byKind("Deployment");
  const pdserveDeployments = deployments.filter((d) => (d.metadata.labels || {})["app.kubernetes.io/name"] === "pdserve");
  for (const d of pdserveDeployments.slice(1)) {
    const first = sharedPodSettings(pdserveDeployments[0], opts.podman);
    const mine = sharedPodSettings(d, opts.podman);
    for (const key of Object.keys(first)) {
      if (JSON.stringify(mine[key]) !== JSON.stringify(first[key])) {
        fail(id(d), `shared pod setting ${key} differs from ${id(pdserveDeployments[0])}'s: ` +
                    `${JSON.stringify(mine[key])} vs ${JSON.stringify(first[key])}`);
      }
    }
  }
  const services = byKind("Service");
  const configMaps = new Map(byKind("ConfigMap").map((c) => [c.metadata.name, c]));
  const pvcs = new Set(byKind("PersistentVolumeClaim").map((c) => c.metadata.name));
  const podLabels = deployments.map((d) => d.spec.template.metadata.labels || {});

  for (const d of deployments) {
    const where = id(d);
    const pod = d.spec.template.spec;
    if (!matchesSelector(d.spec.template.metadata.labels, d.spec.selector)) {
      fail(where, "spec.selector does not match the pod template labels");
    }
    for (const v of pod.volumes || []) {
      if (v.configMap && !configMaps.has(v.configMap.name)) {
        fail(where, `volume ${v.name}: ConfigMap ${v.configMap.name} is not in the render`);
      }
      if (v.persistentVolumeClaim && !pvcs.has(v.persistentVolumeClaim.claimName)) {
        fail(where, `volume ${v.name}: PVC ${v.persistentVolumeClaim.claimName} is not in the render`);
      }
    }
    const volumeNames = new Set((pod.volumes || []).map((v) => v.name));
    for (const c of [...(pod.initContainers || []), ...pod.containers]) {
      for (const vm of c.volumeMounts || []) {
        if (!volumeNames.has(vm.name)) fail(where, `container ${c.name} mounts unknown volume ${vm.name}`);
      }
    }
    for (const c of pod.containers) {
      const flags = containerFlags(pod, c, configMaps, `${where} container ${c.name}`);
      // Declared container ports (informational in Kubernetes, but the
      // Services, probes and PodMonitor use them) must agree with the flags.
      const ports = new Map((c.ports || []).map((p) => [p.name, p.containerPort]));
      const declared = ports.size > 0;
      if (flags.has("port")) {
        const port = Number(flags.get("port"));
        if (declared && ports.get("grpc") !== port) fail(where, `container port grpc != --port=${port}`);
        for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
          if (c[probe] && c[probe].grpc && c[probe].grpc.port !== port) {
            fail(where, `${probe} checks port ${c[probe].grpc.port}, the server listens on ${port}`);
          }
        }
      }
      if (flags.has("metrics_port")) {
        const mport = Number(flags.get("metrics_port"));
        if (declared && ports.get("metrics") !== mport) {
          fail(where, `container port metrics != --metrics_port=${mport}`);
        }
        const ann = (d.spec.template.metadata.annotations || {})["prometheus.io/port"];
        if (ann !== undefined && Number(ann) !== mport) {
          fail(where, `prometheus.io/port=${ann} but --metrics_port=${mport}`);
        }
      }
      // The router's HTTP port (OpenAI API): declared as "http" and what an
      // httpGet probe checks, by name or number.
      if (flags.has("http_port") && Number(flags.get("http_port")) > 0) {
        const hport = Number(flags.get("http_port"));
        if (declared && ports.get("http") !== hport) {
          fail(where, `container port http != --http_port=${hport}`);
        }
        for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
          const get = c[probe] && c[probe].httpGet;
          if (!get) continue;
          const target = typeof get.port === "string" ? ports.get(get.port) : get.port;
          if (declared && target !== hport) {
            fail(where, `${probe} GETs port ${get.port}, the HTTP server listens on ${hport}`);
          }
        }
      }
      if (flags.has("drain_timeout_seconds")) {
        const drain = Number(flags.get("drain_timeout_seconds"));
        const grace = pod.terminationGracePeriodSeconds === undefined ? 30 : pod.terminationGracePeriodSeconds;
        if (!(grace > drain)) {
          fail(where, `terminationGracePeriodSeconds=${grace} must exceed --drain_timeout_seconds=${drain}`);
        }
      }
      for (const flag of ["prefill_workers", "decode_workers"]) {
        if (!flags.has(flag)) continue;
        for (const target of flags.get(flag).split(",")) {
          const m = /^dns:\/\/\/([^:]+):(\d+)$/.exec(target);
          if (!m) continue;  // a static host:port list
          const [svcName, ns] = m[1].split(".");
          if (opts.podman) {
            checkPodmanTarget(flag, target, m[1], Number(m[2]), deployments, configMaps, where);
            continue;
          }
          const svc = services.find((s) => s.metadata.name === svcName);
          if (!svc) {
            fail(where, `--${flag}=${target}: no Service ${svcName} in the render`);
            continue;
          }
          if (svc.metadata.namespace && ns && svc.metadata.namespace !== ns) {
            fail(where, `--${flag}=${target}: Service ${svcName} is in namespace ${svc.metadata.namespace}`);
          }
          if (svc.spec.clusterIP !== "None") fail(where, `--${flag}: Service ${svcName} must be headless`);
          if (!(svc.spec.ports || []).some((p) => p.port === Number(m[2]))) {
            fail(where, `--${flag}=${target}: Service ${svcName} has no port ${m[2]}`);
          }
        }
      }
    }
  }

  for (const s of services) {
    const where = id(s);
    const selected = deployments.filter((d) =>
      matchesSelector(d.spec.template.metadata.labels, { matchLabels: s.spec.selector }));
    if (selected.length === 0) {
      fail(where, "selector matches no Deployment's pods");
      continue;
    }
    for (const p of s.spec.ports || []) {
      if (typeof p.targetPort !== "string") continue;
      for (const d of selected) {
        const named = d.spec.template.spec.containers.some((c) =>
          (c.ports || []).some((cp) => cp.name === p.targetPort));
        if (!named) fail(where, `targetPort ${p.targetPort} is not a named port of ${id(d)}`);
      }
    }
  }

  for (const pdb of byKind("PodDisruptionBudget")) {
    if (!podLabels.some((l) => matchesSelector(l, pdb.spec.selector))) {
      fail(id(pdb), "selector matches no Deployment's pods");
    }
  }
  for (const pm of byKind("PodMonitor")) {
    const selected = deployments.filter((d) => matchesSelector(d.spec.template.metadata.labels, pm.spec.selector));
    if (selected.length === 0) fail(id(pm), "selector matches no Deployment's pods");
    for (const ep of pm.spec.podMetricsEndpoints || []) {
      for (const d of selected) {
        const named = d.spec.template.spec.containers.some((c) => (c.ports || []).some((cp) => cp.name === ep.port));
        if (!named) fail(id(pm), `port ${ep.port} is not a named port of ${id(d)}`);
      }
    }
  }
  for (const np of byKind("NetworkPolicy")) {
    const sel = np.spec.podSelector || {};
    const empty = Object.keys(sel.matchLabels || {}).length === 0 && (sel.matchExpressions || []).length === 0;
    if (!empty && !podLabels.some((l) => matchesSelector(l, sel))) {
      fail(id(np), "podSelector matches no Deployment's pods");
    }
  }

  checkHpas(byKind("HorizontalPodAutoscaler"), deployments, opts);
}

// `podman play kube` names the pods of Deployment D "D-pod-0", "D-pod-1"...
// and resolves those names on its network: a dns:/// target of a podman render
// must be such a pod, and the port its --port.
function checkPodmanTarget(flag, target, host, port, deployments, configMaps, where) {
  const d = deployments.find((dep) => {
    const m = new RegExp(`^${dep.metadata.name}-pod-(\\d+)$`).exec(host);
    return m && Number(m[1]) < (dep.spec.replicas === undefined ? 1 : dep.spec.replicas);
  });
  if (!d) {
    fail(where, `--${flag}=${target}: ${host} is no podman pod of a Deployment in the render`);
    return;
  }
  const pod = d.spec.template.spec;
  const flags = containerFlags(pod, pod.containers[0], configMaps, id(d));
  if (Number(flags.get("port")) !== port) {
    fail(where, `--${flag}=${target}: ${id(d)} listens on --port=${flags.get("port")}`);
  }
}

function checkHpas(hpas, deployments, opts) {
  let served = null;   // custom metric name -> source series name
  if (opts.adapter) {
    served = new Map();
    for (const cm of loadDocs(opts.adapter).filter((d) => d.kind === "ConfigMap")) {
      for (const text of Object.values(cm.data || {})) {
        const config = YAML.parse(text);
        for (const rule of config.rules || []) {
          const source = /^([a-zA-Z_:][a-zA-Z0-9_:]*)/.exec(rule.seriesQuery)[1];
          const re = new RegExp(rule.name.matches);
          if (!re.test(source)) fail("adapter rule", `name.matches ${rule.name.matches} does not match ${source}`);
          served.set(source.replace(re, rule.name.as || "$0"), source);
        }
      }
    }
  }
  let defined = null;
  if (opts.metricDefs) {
    defined = new Set(fs.readFileSync(opts.metricDefs, "utf8").match(/"pdserve_[a-z0-9_]+"/g).map((s) => s.slice(1, -1)));
  }
  for (const hpa of hpas) {
    const ref = hpa.spec.scaleTargetRef;
    if (!deployments.some((d) => ref.kind === "Deployment" && d.metadata.name === ref.name)) {
      fail(id(hpa), `scaleTargetRef ${ref.kind}/${ref.name} is not in the render`);
    }
    for (const m of hpa.spec.metrics || []) {
      if (m.type !== "Pods") continue;
      const name = m.pods.metric.name;
      if (served) {
        if (!served.has(name)) {
          fail(id(hpa), `pod metric ${name} is served by no Prometheus adapter rule`);
        } else if (defined && !defined.has(served.get(name))) {
          fail(id(hpa), `pod metric ${name} comes from ${served.get(name)}, which pdserve does not define`);
        }
      }
    }
  }
}

function main() {
  const opts = parseArgs(process.argv.slice(2));
  const docs = loadDocs(opts.files[0]);
  if (docs.length === 0) fail(opts.files[0], "no objects");
  checkSchema(docs);
  checkConsistency(docs, opts);
  if (opts.dumpFlagfiles) {
    for (const cm of docs.filter((d) => d.kind === "ConfigMap")) {
      for (const [key, text] of Object.entries(cm.data || {})) {
        if (key.endsWith(".flags")) fs.writeFileSync(`${opts.dumpFlagfiles}/${cm.metadata.name}.${key}`, text);
      }
    }
  }
  const kinds = {};
  for (const d of docs) kinds[d.kind] = (kinds[d.kind] || 0) + 1;
  const summary = Object.entries(kinds).map(([k, n]) => `${n} ${k}`).join(", ");
  if (errors.length > 0) {
    for (const e of errors) console.error(`  FAIL ${e}`);
    console.error(`${opts.files[0]}: ${errors.length} error(s) in ${docs.length} objects`);
    process.exit(1);
  }
  console.log(`${opts.files[0]}: ${docs.length} objects valid (${summary})`);
}

main();
