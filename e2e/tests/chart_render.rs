//! The Helm chart as rendered by `helm template` (no cluster, no root): the default names
//! stay what they always were, nameOverride/fullnameOverride rename every object and every
//! reference to one (RBAC subjects and roleRefs, the admission policies' usernames, the
//! agents' own DaemonSet lookup, the operator's leader-election Lease) consistently, the
//! new pod settings land on the pods, the CRD switch, the agents' metrics bind address
//! (which the agent binary itself must accept) and probes, the operator's
//! PodDisruptionBudget, and the schema refusing bad values. The PrometheusRule's and the
//! dashboard's PromQL parses, and every series it reads is one the agent and operator
//! registries really encode (built here, not listed by hand), with role, alarm and
//! reason label values the agent really uses.
//!
//! helm comes from `hack/testbin.sh helm` (built from Go modules once, then cached); the
//! tests skip, saying so, only when it cannot be had.

use havip_node_agent::sm::{Alarm, Reason, Role};
use promql_parser::label::MatchOp;
use promql_parser::parser::{self, Expr};
use serde_yaml::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> PathBuf {
    repo().join("charts/havip")
}

/// The helm binary, or `None` (with the reason printed) when hack/testbin.sh cannot provide it.
fn helm() -> Option<PathBuf> {
    static HELM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = HELM.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo().join("hack/testbin.sh"))
            .arg("helm")
            .output()
            .map_err(|e| format!("running hack/testbin.sh helm: {e}"))?;
        if !out.status.success() {
            return Err(format!("hack/testbin.sh helm failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let dir = String::from_utf8_lossy(&out.stdout).lines().last().map(PathBuf::from).unwrap_or_default();
        let helm = dir.join("helm");
        if helm.is_file() { Ok(helm) } else { Err(format!("{} is not a file", helm.display())) }
    });
    match found {
        Ok(h) => Some(h.clone()),
        Err(why) => {
            eprintln!("SKIPPED: helm cannot be built ({why})");
            None
        }
    }
}

/// `helm template` of the chart in namespace `ns` with `args` (`--set …`, `--include-crds`).
fn template(helm: &Path, ns: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(helm)
        .args(["template", "rel"])
        .arg(chart())
        .args(["--namespace", ns])
        .args(args)
        .output()
        .map_err(|e| format!("helm template: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The rendered objects of `helm template … args` (which must succeed).
fn render(helm: &Path, ns: &str, args: &[&str]) -> Objects {
    let text = template(helm, ns, args).unwrap_or_else(|e| panic!("helm template {args:?} failed: {e}"));
    Objects::parse(&text)
}

/// Every document of a render, by kind and name.
struct Objects(Vec<Value>);

impl Objects {
    fn parse(text: &str) -> Self {
        use serde::Deserialize;
        let docs = serde_yaml::Deserializer::from_str(text)
            .map(|d| Value::deserialize(d).expect("the render is YAML"))
            .filter(|v| !v.is_null())
            .collect();
        Objects(docs)
    }
    fn of_kind(&self, kind: &str) -> impl Iterator<Item = &Value> + '_ {
        let kind = kind.to_owned();
        self.0.iter().filter(move |v| v["kind"].as_str() == Some(kind.as_str()))
    }
    fn names(&self, kind: &str) -> BTreeSet<String> {
        self.of_kind(kind).map(|v| str_of(&v["metadata"]["name"]).to_owned()).collect()
    }
    fn get(&self, kind: &str, name: &str) -> &Value {
        self.of_kind(kind)
            .find(|v| v["metadata"]["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no {kind} {name} in the render; {kind}s: {:?}", self.names(kind)))
    }
    fn one(&self, kind: &str) -> &Value {
        let all: Vec<&Value> = self.of_kind(kind).collect();
        assert_eq!(all.len(), 1, "expected one {kind}, got {}", all.len());
        all[0]
    }
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("expected a string, got {v:?}"))
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let v = match v {
                        Value::String(s) => s.clone(),
                        other => panic!("label/annotation {k:?} is not a string: {other:?}"),
                    };
                    (str_of(k).to_owned(), v)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The container's environment variable `name`: its value, or `fieldRef:<path>`.
fn env(container: &Value, name: &str) -> Option<String> {
    let e = container["env"].as_sequence()?.iter().find(|e| e["name"].as_str() == Some(name))?;
    match e["value"].as_str() {
        Some(v) => Some(v.to_owned()),
        None => e["valueFrom"]["fieldRef"]["fieldPath"].as_str().map(|p| format!("fieldRef:{p}")),
    }
}

fn args(container: &Value) -> Vec<String> {
    container["args"].as_sequence().expect("args").iter().map(|a| str_of(a).to_owned()).collect()
}

/// The value of `--flag=value` (or `--flag value`) in `args`.
fn flag(args: &[String], flag: &str) -> Option<String> {
    let eq = format!("{flag}=");
    args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix(&eq).map(str::to_owned).or_else(|| (a == flag).then(|| args.get(i + 1).cloned()).flatten())
    })
}

fn container(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]["containers"][0]
}

/// Everything that must agree across a render, whatever the names: what each binding,
/// workload and policy names exists; selectors select the pods; the agent finds its own
/// DaemonSet and may read it; the admission policies' usernames are the ServiceAccounts'.
/// Returns (operator name, agent name).
fn check_consistent(o: &Objects, ns: &str) -> (String, String) {
    let sas = o.names("ServiceAccount");
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        let roles = o.names(if kind == "RoleBinding" { "Role" } else { "ClusterRole" });
        for b in o.of_kind(kind) {
            let role = str_of(&b["roleRef"]["name"]);
            assert!(roles.contains(role), "{kind} {:?} names the missing role {role}", b["metadata"]["name"]);
            for s in b["subjects"].as_sequence().expect("subjects") {
                assert_eq!(s["kind"].as_str(), Some("ServiceAccount"));
                assert!(sas.contains(str_of(&s["name"])), "{kind} subject {:?} is no ServiceAccount of the chart", s);
                assert_eq!(s["namespace"].as_str(), Some(ns));
            }
        }
    }
    let policies = o.names("ValidatingAdmissionPolicy");
    assert_eq!(policies.len(), 5, "{policies:?}");
    for b in o.of_kind("ValidatingAdmissionPolicyBinding") {
        assert!(policies.contains(str_of(&b["spec"]["policyName"])), "{:?}", b["metadata"]["name"]);
    }
    assert_eq!(o.names("ValidatingAdmissionPolicyBinding"), policies);
    // Each policy matches the requests of one of the chart's ServiceAccounts, by username.
    for p in o.of_kind("ValidatingAdmissionPolicy") {
        let cond = str_of(&p["spec"]["matchConditions"][0]["expression"]);
        let user = cond
            .strip_prefix("request.userInfo.username == '")
            .and_then(|r| r.strip_suffix('\''))
            .unwrap_or_else(|| panic!("unexpected match condition {cond}"));
        let sa = user
            .strip_prefix(&format!("system:serviceaccount:{ns}:"))
            .unwrap_or_else(|| panic!("{user} is not a ServiceAccount of namespace {ns}"));
        assert!(sas.contains(sa), "policy {:?} matches {user}, no ServiceAccount of the chart", p["metadata"]["name"]);
        let name = str_of(&p["metadata"]["name"]);
        assert!(name.starts_with(&format!("{sa}-")), "policy {name} is named after {sa}");
    }
    let deploy = o.one("Deployment");
    let ds = o.one("DaemonSet");
    let operator = str_of(&deploy["metadata"]["name"]).to_owned();
    let agent = str_of(&ds["metadata"]["name"]).to_owned();
    for (w, name) in [(deploy, &operator), (ds, &agent)] {
        assert_eq!(str_of(&w["spec"]["template"]["spec"]["serviceAccountName"]), name.as_str());
        assert!(sas.contains(name.as_str()));
        let selector = string_map(&w["spec"]["selector"]["matchLabels"]);
        let labels = string_map(&w["spec"]["template"]["metadata"]["labels"]);
        for (k, v) in &selector {
            assert_eq!(labels.get(k), Some(v), "{name}: the pods carry the selector's {k}");
        }
        for kind in ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"] {
            o.get(kind, name);
        }
    }
    // The agent reads its own DaemonSet on SIGTERM: named to it, and allowed by its Role.
    let c = container(ds);
    assert_eq!(env(c, "HAVIP_DAEMONSET").as_deref(), Some(agent.as_str()));
    let rules = o.get("Role", &agent)["rules"].as_sequence().expect("rules").clone();
    let ds_rule = rules.iter().find(|r| r["resources"][0].as_str() == Some("daemonsets")).expect("daemonsets rule");
    assert_eq!(ds_rule["resourceNames"][0].as_str(), Some(agent.as_str()));
    // The operator's leader-election Lease is named after it (the binary's default is
    // havip-operator: passed, never left to agree by chance) and is no pair Lease.
    let lease = flag(&args(container(deploy)), "--leader-election-lease").expect("--leader-election-lease");
    assert_eq!(lease, operator);
    assert!(!havip_crds::lease::is_pair_lease(&lease));
    // Metrics Services select the pods, ServiceMonitors the Services.
    for svc in o.of_kind("Service") {
        let sel = string_map(&svc["spec"]["selector"]);
        let component = sel.get("app.kubernetes.io/component").expect("component").clone();
        let w = if component == "agent" { ds } else { deploy };
        let labels = string_map(&w["spec"]["template"]["metadata"]["labels"]);
        assert!(sel.iter().all(|(k, v)| labels.get(k) == Some(v)), "Service {:?} selects no pod", svc["metadata"]);
    }
    for sm in o.of_kind("ServiceMonitor") {
        let sel = string_map(&sm["spec"]["selector"]["matchLabels"]);
        let selected = o
            .of_kind("Service")
            .filter(|s| {
                let l = string_map(&s["metadata"]["labels"]);
                sel.iter().all(|(k, v)| l.get(k) == Some(v))
            })
            .count();
        assert_eq!(selected, 1, "ServiceMonitor {:?} selects one Service", sm["metadata"]["name"]);
    }
    // The agents record Events only in `default` (where the API server puts those of
    // cluster-scoped objects), through events.k8s.io; their ClusterRole grants no Events.
    let events = format!("{agent}-events");
    let role = o.get("Role", &events);
    assert_eq!(role["metadata"]["namespace"].as_str(), Some("default"));
    let rules = role["rules"].as_sequence().expect("rules");
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(serde_yaml::to_string(&rules[0]["apiGroups"]).expect("yaml").trim(), "- events.k8s.io");
    assert_eq!(serde_yaml::to_string(&rules[0]["resources"]).expect("yaml").trim(), "- events");
    assert_eq!(serde_yaml::to_string(&rules[0]["verbs"]).expect("yaml").trim(), "- create\n- patch");
    let binding = o.get("RoleBinding", &events);
    assert_eq!(binding["metadata"]["namespace"].as_str(), Some("default"));
    assert_eq!(str_of(&binding["subjects"][0]["name"]), agent.as_str());
    let cluster = o.get("ClusterRole", &agent)["rules"].as_sequence().expect("rules").clone();
    assert!(
        cluster.iter().all(|r| !r["resources"]
            .as_sequence()
            .expect("resources")
            .iter()
            .any(|x| x.as_str() == Some("events"))),
        "the agents' ClusterRole grants no Events: {cluster:?}"
    );
    // Every other object of the chart's goes into the release namespace or is cluster-scoped.
    // Except the two Roles (and bindings) in `default`: the agents' Events, and the
    // operator's read of the API server's own addresses (the EndpointSlice `kubernetes`).
    let in_default = [events.clone(), format!("{operator}-api-server-addresses")];
    for v in &o.0 {
        if let Some(n) = v["metadata"]["namespace"].as_str() {
            if in_default.iter().any(|d| str_of(&v["metadata"]["name"]) == d.as_str()) {
                assert_eq!(n, "default", "{:?}", v["metadata"]["name"]);
                continue;
            }
            assert_eq!(n, ns, "{:?}", v["metadata"]["name"]);
        }
    }
    (operator, agent)
}

#[test]
fn the_default_names_stay_what_they_were() {
    let Some(helm) = helm() else { return };
    let o = render(&helm, "havip-system", &[]);
    let (operator, agent) = check_consistent(&o, "havip-system");
    assert_eq!((operator.as_str(), agent.as_str()), ("havip-operator", "havip-agent"));
    let both: BTreeSet<String> = ["havip-agent", "havip-operator"].map(str::to_owned).into();
    for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
        assert_eq!(o.names(kind), both, "{kind}");
    }
    let roles: BTreeSet<String> =
        ["havip-agent", "havip-agent-events", "havip-operator", "havip-operator-api-server-addresses"]
            .map(str::to_owned)
            .into();
    for kind in ["Role", "RoleBinding"] {
        assert_eq!(o.names(kind), roles, "{kind}");
    }
    let policies: BTreeSet<String> = [
        "havip-agent-events",
        "havip-agent-floatingip-status",
        "havip-agent-hapair-status",
        "havip-agent-pair-leases",
        "havip-operator-metadata",
    ]
    .map(str::to_owned)
    .into();
    assert_eq!(o.names("ValidatingAdmissionPolicy"), policies);
    assert_eq!(o.names("PodDisruptionBudget"), ["havip-operator".to_owned()].into());
    for off in ["PrometheusRule", "ConfigMap", "ServiceMonitor", "Service", "CustomResourceDefinition"] {
        assert_eq!(o.of_kind(off).count(), 0, "no {off} by default");
    }
    // The release name does not enter the names (an install named otherwise keeps them).
    let other = Command::new(&helm)
        .args(["template", "something-else"])
        .arg(chart())
        .args(["--namespace", "havip-system"])
        .output()
        .expect("helm template");
    assert!(other.status.success(), "{}", String::from_utf8_lossy(&other.stderr));
    let other = Objects::parse(&String::from_utf8_lossy(&other.stdout));
    assert_eq!(other.names("DaemonSet"), ["havip-agent".to_owned()].into());
    // The committed default render is this one (make chart-check diffs it too).
    let committed = std::fs::read_to_string(repo().join("charts/rendered/havip-default.yaml")).expect("rendered");
    let now = Command::new(&helm)
        .args(["template", "havip"])
        .arg(chart())
        .args(["-n", "havip-system"])
        .output()
        .expect("helm template");
    assert_eq!(String::from_utf8_lossy(&now.stdout), committed, "run make chart");
}

#[test]
fn name_overrides_rename_every_object_and_every_reference() {
    let Some(helm) = helm() else { return };
    let o = render(
        &helm,
        "vips",
        &[
            "--set",
            "fullnameOverride=acme-vip",
            "--set",
            "nameOverride=vip",
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "grafanaDashboard.enabled=true",
        ],
    );
    let (operator, agent) = check_consistent(&o, "vips");
    assert_eq!((operator.as_str(), agent.as_str()), ("acme-vip-operator", "acme-vip-agent"));
    for v in &o.0 {
        let name = str_of(&v["metadata"]["name"]);
        assert!(name.starts_with("acme-vip"), "{} {name} does not follow fullnameOverride", str_of(&v["kind"]));
        assert_eq!(string_map(&v["metadata"]["labels"]).get("app.kubernetes.io/name").map(String::as_str), Some("vip"));
    }
    // No reference to a default name is left anywhere (usernames, resourceNames, env, args).
    let text = template(
        &helm,
        "vips",
        &[
            "--set",
            "fullnameOverride=acme-vip",
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "prometheusRule.enabled=true",
        ],
    )
    .expect("render");
    for line in text.lines().filter(|l| l.contains("havip-operator") || l.contains("havip-agent")) {
        let l = line.trim();
        assert!(
            l.starts_with('#')
                || l.starts_with("image:")
                || l.contains("havip-agent:")
                || l.contains("havip-operator:")
                || l.contains("reportingController"),
            "a default name is left: {l}"
        );
    }
    // The agents' Events policy expects the binary's reportingController, which no name
    // override changes.
    let events = o.get("ValidatingAdmissionPolicy", "acme-vip-agent-events");
    let ours = events["spec"]["variables"]
        .as_sequence()
        .expect("variables")
        .iter()
        .find(|v| v["name"].as_str() == Some("ours"))
        .expect("ours");
    let want = format!("object.reportingController == '{}'", havip_crds::reporting::AGENT);
    assert!(str_of(&ours["expression"]).contains(&want), "{:?}", ours["expression"]);
    let rule = o.one("PrometheusRule");
    let exprs: Vec<&str> = rule["spec"]["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules").iter().map(|r| str_of(&r["expr"])))
        .collect();
    assert!(exprs.iter().any(|e| e.contains(r#"job="acme-vip-agent-metrics",namespace="vips""#)), "{exprs:?}");
    assert!(exprs.iter().any(|e| e.contains(r#"job="acme-vip-operator-metrics",namespace="vips""#)), "{exprs:?}");
    // nameOverride alone renames too.
    let o = render(&helm, "havip-system", &["--set", "nameOverride=vip"]);
    assert_eq!(check_consistent(&o, "havip-system"), ("vip-operator".to_owned(), "vip-agent".to_owned()));
}

#[test]
fn pod_settings_and_the_operator_disruption_budget() {
    let Some(helm) = helm() else { return };
    let o = render(
        &helm,
        "havip-system",
        &[
            "--set",
            "operator.priorityClassName=system-cluster-critical",
            "--set-string",
            "operator.podAnnotations.example\\.com/owner=team-net",
            "--set-string",
            "operator.podLabels.team=net",
            "--set-string",
            "agent.podAnnotations.prometheus\\.io/scrape=false",
            "--set-string",
            "agent.podLabels.tier=node",
            "--set",
            "operator.podDisruptionBudget.maxUnavailable=50%",
        ],
    );
    check_consistent(&o, "havip-system");
    let deploy = o.get("Deployment", "havip-operator");
    let ds = o.get("DaemonSet", "havip-agent");
    let pod = |w: &Value| w["spec"]["template"]["metadata"].clone();
    assert_eq!(deploy["spec"]["template"]["spec"]["priorityClassName"].as_str(), Some("system-cluster-critical"));
    assert_eq!(ds["spec"]["template"]["spec"]["priorityClassName"].as_str(), Some("system-node-critical"));
    assert_eq!(string_map(&pod(deploy)["annotations"]).get("example.com/owner").map(String::as_str), Some("team-net"));
    assert_eq!(string_map(&pod(deploy)["labels"]).get("team").map(String::as_str), Some("net"));
    assert_eq!(string_map(&pod(ds)["annotations"]).get("prometheus.io/scrape").map(String::as_str), Some("false"));
    assert_eq!(string_map(&pod(ds)["labels"]).get("tier").map(String::as_str), Some("node"));
    // Extra labels go on the pods, never into the selectors (immutable).
    assert!(!string_map(&ds["spec"]["selector"]["matchLabels"]).contains_key("tier"));
    let pdb = o.get("PodDisruptionBudget", "havip-operator");
    assert_eq!(pdb["spec"]["maxUnavailable"].as_str(), Some("50%"));
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"].as_str(), Some("AlwaysAllow"));
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], deploy["spec"]["selector"]["matchLabels"]);
    // Without them: no priority class, no annotations on the operator pods.
    let o = render(&helm, "havip-system", &[]);
    let deploy = o.get("Deployment", "havip-operator");
    assert!(deploy["spec"]["template"]["spec"]["priorityClassName"].is_null());
    assert!(deploy["spec"]["template"]["metadata"]["annotations"].is_null());
    assert_eq!(o.get("PodDisruptionBudget", "havip-operator")["spec"]["maxUnavailable"].as_u64(), Some(1));
    // One replica: a budget would only block drains. Disabled: none either.
    for set in ["operator.replicas=1", "operator.podDisruptionBudget.enabled=false"] {
        assert_eq!(render(&helm, "havip-system", &["--set", set]).of_kind("PodDisruptionBudget").count(), 0, "{set}");
    }
}

#[test]
fn the_crd_switch_leaves_the_crds_out() {
    let Some(helm) = helm() else { return };
    let crds = |args: &[&str]| -> BTreeSet<String> {
        let mut a = vec!["--include-crds"];
        a.extend_from_slice(args);
        render(&helm, "havip-system", &a).names("CustomResourceDefinition")
    };
    let all: BTreeSet<String> =
        ["floatingips.havip.io", "hapairs.havip.io", "vippools.havip.io"].map(str::to_owned).into();
    assert_eq!(crds(&[]), all);
    assert_eq!(crds(&["--set", "crds.install=true"]), all);
    assert_eq!(crds(&["--set", "crds.install=false"]), BTreeSet::new());
    // The CRDs Helm installs are the generated ones (crdgen writes them into the subchart).
    let generated = havip_crds::crds_yaml().expect("crds");
    let on_disk = std::fs::read_to_string(repo().join(havip_crds::CRDS_PATH)).expect("CRD file");
    assert_eq!(on_disk, generated, "run make crds");
    assert!(havip_crds::CRDS_PATH.starts_with("charts/havip/charts/crds/crds/"));
}

#[test]
fn the_agents_metrics_bind_address_and_probes() {
    let Some(helm) = helm() else { return };
    // (value, --metrics-address, probe host)
    let cases: [(Option<&str>, &str, Option<&str>); 6] = [
        (None, "$(HAVIP_HOST_IP):9797", None),
        (Some("hostIP"), "$(HAVIP_HOST_IP):9797", None),
        (Some("loopback"), "127.0.0.1:9797", Some("127.0.0.1")),
        (Some("192.0.2.7"), "192.0.2.7:9797", Some("192.0.2.7")),
        (Some("fd00::7"), "[fd00::7]:9797", Some("fd00::7")),
        (Some("0.0.0.0"), "0.0.0.0:9797", None),
    ];
    for (value, address, host) in cases {
        let set = value.map(|v| format!("agent.metricsBindAddress={v}"));
        let a: Vec<&str> = set.as_deref().map(|s| vec!["--set", s]).unwrap_or_default();
        let o = render(&helm, "havip-system", &a);
        let c = container(o.get("DaemonSet", "havip-agent"));
        let got = flag(&args(c), "--metrics-address").expect("--metrics-address");
        assert_eq!(got, address, "{value:?}");
        assert_eq!(env(c, "HAVIP_HOST_IP").as_deref(), Some("fieldRef:status.hostIP"));
        for probe in ["livenessProbe", "readinessProbe"] {
            let p = &c[probe]["httpGet"];
            assert_eq!(p["port"].as_str(), Some("metrics"), "{value:?} {probe}");
            assert_eq!(p["host"].as_str(), host, "{value:?} {probe}");
        }
        // The agent binary takes what the kubelet makes of it, for either family of host IP.
        for host_ip in ["10.1.2.3", "fd00:10::3"] {
            let expanded = got.replace("$(HAVIP_HOST_IP)", host_ip);
            let addr = havip_node_agent::metrics::parse_address(&expanded)
                .unwrap_or_else(|e| panic!("{value:?}: {e}"))
                .expect("an address");
            assert_eq!(addr.port(), 9797);
            if got.starts_with("$(") {
                assert_eq!(addr.ip().to_string(), host_ip);
            }
        }
    }
    // A port of its own goes everywhere.
    let o = render(&helm, "havip-system", &["--set", "agent.metricsPort=9100"]);
    let c = container(o.get("DaemonSet", "havip-agent"));
    assert_eq!(flag(&args(c), "--metrics-address").as_deref(), Some("$(HAVIP_HOST_IP):9100"));
    assert_eq!(c["ports"][0]["containerPort"].as_u64(), Some(9100));
    // The ServiceMonitor scrapes the node's address (with a node label): loopback is refused.
    let o = render(&helm, "havip-system", &["--set", "serviceMonitor.enabled=true"]);
    let sm = o.get("ServiceMonitor", "havip-agent");
    assert_eq!(sm["spec"]["endpoints"][0]["relabelings"][0]["targetLabel"].as_str(), Some("node"));
    let e = template(
        &helm,
        "havip-system",
        &["--set", "serviceMonitor.enabled=true", "--set", "agent.metricsBindAddress=loopback"],
    )
    .expect_err("a ServiceMonitor cannot scrape loopback");
    assert!(e.contains("loopback"), "{e}");
}

/// `agent.bgp.frr.inPod`: zebra, bgpd and bfdd from the havip-frr image beside the agent,
/// sharing an emptyDir for their sockets, which the agent reads bgpd's vty socket from (not
/// the node's hostPath), the speaker forced to FRR, the configuration in a ConfigMap; never
/// privileged, every capability dropped but the daemon's own. Without a configuration the
/// chart refuses; without inPod none of it is there.
#[test]
fn the_in_pod_frr_runs_beside_the_agent_and_shares_its_sockets() {
    let Some(helm) = helm() else { return };
    let conf = "frr defaults datacenter\nrouter bgp 64600\n";
    let o = render(
        &helm,
        "havip-system",
        &["--set", "agent.bgp.frr.inPod=true", "--set-string", &format!("agent.bgp.frr.config={conf}")],
    );
    let ds = o.get("DaemonSet", "havip-agent");
    let spec = &ds["spec"]["template"]["spec"];
    let containers = spec["containers"].as_sequence().expect("containers");
    let names: Vec<&str> = containers.iter().map(|c| str_of(&c["name"])).collect();
    assert_eq!(names, ["agent", "frr-zebra", "frr-bgpd", "frr-bfdd"]);
    let agent = &containers[0];
    assert_eq!(env(agent, "HAVIP_BGP_SPEAKER").as_deref(), Some("frr"));
    let vty =
        agent["volumeMounts"].as_sequence().expect("mounts").iter().find(|m| m["name"].as_str() == Some("frr-vty"));
    assert_eq!(vty.and_then(|m| m["mountPath"].as_str()), env(agent, "HAVIP_FRR_VTY_DIR").as_deref());
    let volumes = spec["volumes"].as_sequence().expect("volumes");
    let vol = volumes.iter().find(|v| v["name"].as_str() == Some("frr-vty")).expect("frr-vty volume");
    assert!(vol["emptyDir"].is_mapping() && vol["hostPath"].is_null(), "{vol:?}");
    for c in &containers[1..] {
        let daemon = str_of(&c["name"]).trim_start_matches("frr-");
        assert_eq!(c["command"][0].as_str(), Some(format!("/usr/lib/frr/{daemon}").as_str()));
        assert!(str_of(&c["image"]).contains("/havip-frr:"), "{:?}", c["image"]);
        let sc = &c["securityContext"];
        assert_eq!((sc["privileged"].as_bool(), sc["capabilities"]["drop"][0].as_str()), (Some(false), Some("ALL")));
        let mounts: Vec<&str> =
            c["volumeMounts"].as_sequence().expect("mounts").iter().map(|m| str_of(&m["mountPath"])).collect();
        assert!(mounts.contains(&"/var/run/frr") && mounts.contains(&"/etc/frr"), "{mounts:?}");
    }
    assert!(
        containers[2]["securityContext"]["capabilities"]["add"]
            .as_sequence()
            .expect("caps")
            .iter()
            .any(|c| c.as_str() == Some("NET_BIND_SERVICE"))
    );
    let cm = o.get("ConfigMap", "havip-agent-frr");
    assert_eq!(cm["data"]["frr.conf"].as_str(), Some(conf));

    let e = template(&helm, "havip-system", &["--set", "agent.bgp.frr.inPod=true"]).expect_err("no configuration");
    assert!(e.contains("agent.bgp.frr.config"), "{e}");
    let o = render(&helm, "havip-system", &[]);
    let spec = &o.get("DaemonSet", "havip-agent")["spec"]["template"]["spec"];
    assert_eq!(spec["containers"].as_sequence().map(Vec::len), Some(1));
    assert!(o.names("ConfigMap").iter().all(|n| !n.ends_with("-frr")));
}

#[test]
fn the_schema_refuses_bad_values() {
    let Some(helm) = helm() else { return };
    for (set, why) in [
        ("agent.metricsBindAddress=everywhere", "not hostIP, loopback or an address"),
        ("agent.metricsBindAddress=10.0.0.256", "not an IPv4 address"),
        ("operator.podDisruptionBudget.maxUnavailable=0", "a budget of 0 blocks every drain"),
        ("operator.podDisruptionBudget.maxUnavailable=150%", "not a percentage"),
        ("operator.podDisruptionBudget.enabled=yes", "not a boolean"),
        ("fullnameOverride=Acme_VIP", "not a DNS label"),
        ("fullnameOverride=hapair-x", "the pair Leases' prefix"),
        ("nameOverride=a-name-that-is-far-too-long-for-every-object-of-it", "over 40 characters"),
        ("agent.podLabels.app\\.kubernetes\\.io/component=x", "a selector label"),
        ("operator.podLabels.app\\.kubernetes\\.io/instance=x", "a selector label"),
        ("operator.podAnnotations.n=1", "not a string"),
        ("crds.install=maybe", "not a boolean"),
        ("prometheusRule.enabled=yes", "not a boolean"),
        ("prometheusRule.severity=page", "no such value"),
        ("grafanaDashboard.sidecarLabelValue=1", "not a string"),
        ("grafanaDashboard.sidecarLabel=not a label", "not a label key"),
        ("grafanaDashboard.folder=havip", "no such value"),
    ] {
        let r = template(&helm, "havip-system", &["--set", set]);
        let e = r.err().unwrap_or_else(|| panic!("{set} ({why}) was accepted"));
        assert!(e.contains("schema"), "{set}: refused, but not by the schema: {e}");
    }
    // And what the schema allows renders.
    for set in [
        "agent.metricsBindAddress=::",
        "agent.metricsBindAddress=2001:db8::1",
        "operator.podDisruptionBudget.maxUnavailable=2",
        "global.registry=x",
    ] {
        template(&helm, "havip-system", &["--set", set]).unwrap_or_else(|e| panic!("{set}: {e}"));
    }
}

/// The agents' Lease policy bounds an epoch step by what the agents themselves never
/// exceed (a larger catch-up is not sent: `LeaseBehind`).
#[test]
fn the_lease_policy_bounds_the_epoch_step_as_the_agents_do() {
    let text = std::fs::read_to_string(chart().join("templates/rbac-agent.yaml")).expect("rbac-agent.yaml");
    let step = havip_node_agent::sm::MAX_LEASE_STEP;
    let rule = format!("variables.newEpoch <= variables.oldEpoch + {step}");
    assert!(text.contains(&rule), "rbac-agent.yaml has no {rule}");
    assert_eq!(text.matches(&format!("at most {step}")).count(), 3, "the comment and both messages say {step}");
}

#[test]
fn the_chart_refuses_the_kubernetes_system_namespaces() {
    let Some(helm) = helm() else { return };
    // The agents' Role reads every Secret of the release namespace (the heartbeat keys live
    // there): in a namespace shared with the cluster's own components that would be their
    // Secrets too.
    for ns in ["kube-system", "default", "kube-public", "kube-node-lease"] {
        let e = template(&helm, ns, &[]).err().unwrap_or_else(|| panic!("an install into {ns} was rendered"));
        assert!(
            e.contains(&format!("havip must not be installed into the namespace {ns}"))
                && e.contains("every Secret of its namespace"),
            "{ns}: refused, but not saying why: {e}"
        );
    }
    // Any namespace of its own renders (names close to the refused ones included).
    for ns in ["havip-system", "vips", "kube-system-havip", "defaults"] {
        template(&helm, ns, &[]).unwrap_or_else(|e| panic!("{ns}: {e}"));
    }
}

/// Every sample name the agents and the operator expose, read from what their registries
/// encode (OpenMetrics: a counter's samples are <name>_total, a histogram's _bucket, _sum
/// and _count), plus `up`, the series Prometheus itself keeps per target. The registries
/// encode no family that has no series yet, so each family gets one first; a family
/// registered in either metrics.rs and not touched here fails the count below.
fn exported_series() -> BTreeSet<String> {
    use havip_operator::metrics::KindLabels;
    let agent = std::sync::Arc::new(havip_node_agent::metrics::AgentMetrics::new());
    let pair = agent.pair("web");
    pair.sent_counter("data").inc();
    pair.received_counter("data").inc();
    pair.rtt("data", std::time::Duration::from_micros(250));
    pair.dropped("data", "bad_mac");
    pair.set_role("Active", &["Active"]);
    pair.set_epoch(1);
    pair.transition("Takeover");
    pair.set_vips_held(1);
    pair.announced("garp");
    pair.probe("peer", true);
    pair.conflict();
    pair.set_alarm("VipConflict", true);
    pair.io_error("persist");
    pair.set_adverts_ignored(0);
    pair.set_drain_active(false);
    pair.drain_forwarded(0, 0);
    pair.set_drain_connections(0);
    pair.drain_connections_cut(0);
    pair.set_speaker(true, 2, 2, 1);
    pair.bgp_route_change("advertised");
    agent.watch_event("HAPair", "applied");
    agent.datagram_sent("bundle");
    let operator = havip_operator::metrics::Metrics::new();
    operator.reconciled("hapair", "ok", std::time::Duration::from_millis(1));
    operator.error(&havip_operator::Error::CacheSync { seconds: 1 });
    operator.status_writes.get_or_create(&KindLabels { kind: "HAPair" }).inc();
    operator.leader.set(1);
    operator.pair_phases.set_source(Box::new(|| std::collections::BTreeMap::from([("Live".to_owned(), 1)])));
    let mut names = BTreeSet::from(["up".to_owned()]);
    for (text, source) in
        [(agent.encode(), "node-agent/src/metrics.rs"), (operator.encode(), "operator/src/metrics.rs")]
    {
        assert!(text.ends_with("# EOF\n"), "OpenMetrics text: {text}");
        let code = std::fs::read_to_string(repo().join(source)).expect("metrics source");
        let registered = code.matches("register(").count() + code.matches("register_collector(").count();
        let types: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).collect();
        assert_eq!(
            types.len(),
            registered,
            "{source} registers {registered} families, {} encoded: give the new one a series in exported_series()",
            types.len()
        );
        let mut derived = BTreeSet::new();
        for t in types {
            let (name, kind) = t.split_once(' ').expect("# TYPE name kind");
            match kind {
                "counter" => {
                    derived.insert(format!("{name}_total"));
                }
                "gauge" => {
                    derived.insert(name.to_owned());
                }
                "histogram" => {
                    for s in ["bucket", "sum", "count"] {
                        derived.insert(format!("{name}_{s}"));
                    }
                }
                other => panic!("{name}: no rule for metric type {other}"),
            }
        }
        // The rule above is what the encoder does: the samples are exactly those names.
        let samples: BTreeSet<String> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(['{', ' ']).next().expect("sample name").to_owned())
            .collect();
        assert_eq!(samples, derived, "{source}");
        names.extend(derived);
    }
    names
}

/// Checks one PromQL expression: it parses, every selector names an exported series, and
/// the `name` label values it matches on the role, alarm and transition series are ones
/// the agent uses. Returns the series it reads.
fn check_promql(expr: &str, exported: &BTreeSet<String>, what: &str) -> BTreeSet<String> {
    let parsed = parser::parse(expr).unwrap_or_else(|e| panic!("{what}: {expr:?} does not parse: {e}"));
    let mut selectors = Vec::new();
    walk(&parsed, &mut selectors);
    assert!(!selectors.is_empty(), "{what}: {expr} reads no series");
    let mut read = BTreeSet::new();
    for vs in selectors {
        let name = vs.name.clone().unwrap_or_else(|| panic!("{what}: a selector without a metric name in {expr}"));
        assert!(exported.contains(&name), "{what}: {name} is not exported by the agents or the operator ({expr})");
        let allowed: Vec<&str> = match name.as_str() {
            "havip_agent_role" => Role::ALL.iter().map(|r| r.as_str()).collect(),
            "havip_agent_alarms" => Alarm::ALL.iter().map(|a| a.as_str()).collect(),
            "havip_agent_role_transitions_total" => Reason::ALL.iter().map(|r| r.as_str()).collect(),
            _ => Vec::new(),
        };
        for m in vs.matchers.matchers.iter().filter(|m| m.name == "name" && !allowed.is_empty()) {
            let values: Vec<&str> = match &m.op {
                MatchOp::Equal | MatchOp::NotEqual => vec![m.value.as_str()],
                MatchOp::Re(_) | MatchOp::NotRe(_) => m.value.split('|').collect(),
            };
            for v in values {
                assert!(
                    allowed.contains(&v),
                    "{what}: {name}{{name=…}} matches {v:?}, which the agent never sets ({expr})"
                );
            }
        }
        read.insert(name);
    }
    read
}

fn walk<'a>(e: &'a Expr, out: &mut Vec<&'a promql_parser::parser::VectorSelector>) {
    match e {
        Expr::Aggregate(a) => {
            walk(&a.expr, out);
            if let Some(p) = &a.param {
                walk(p, out);
            }
        }
        Expr::Unary(u) => walk(&u.expr, out),
        Expr::Binary(b) => {
            walk(&b.lhs, out);
            walk(&b.rhs, out);
        }
        Expr::Paren(p) => walk(&p.expr, out),
        Expr::Subquery(s) => walk(&s.expr, out),
        Expr::VectorSelector(vs) => out.push(vs),
        Expr::MatrixSelector(ms) => out.push(&ms.vs),
        Expr::Call(c) => c.args.args.iter().for_each(|a| walk(a, out)),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

#[test]
fn the_alerts_read_only_exported_series_and_say_what_to_do() {
    let Some(helm) = helm() else { return };
    let exported = exported_series();
    let o = render(&helm, "havip-system", &[]);
    assert_eq!(o.of_kind("PrometheusRule").count(), 0, "off by default");
    let o = render(
        &helm,
        "havip-system",
        &["--set", "prometheusRule.enabled=true", "--set-string", "prometheusRule.labels.release=kps"],
    );
    let rule = o.get("PrometheusRule", "havip");
    assert_eq!(string_map(&rule["metadata"]["labels"]).get("release").map(String::as_str), Some("kps"));
    let mut alerts = BTreeSet::new();
    for g in rule["spec"]["groups"].as_sequence().expect("groups") {
        for r in g["rules"].as_sequence().expect("rules") {
            let alert = str_of(&r["alert"]).to_owned();
            let expr = str_of(&r["expr"]);
            let read = check_promql(expr, &exported, &alert);
            // The default selectors: the chart's ServiceMonitors' jobs, in the release namespace.
            let job =
                if read.iter().any(|n| n.starts_with("havip_operator_")) { "havip-operator" } else { "havip-agent" };
            assert!(expr.contains(&format!(r#"job="{job}-metrics",namespace="havip-system""#)), "{alert}: {expr}");
            let for_ = str_of(&r["for"]);
            assert!(
                for_.ends_with('m') && for_.trim_end_matches('m').parse::<u32>().is_ok_and(|m| m >= 1),
                "{alert}: for {for_}"
            );
            let severity = str_of(&r["labels"]["severity"]);
            assert!(["critical", "warning"].contains(&severity), "{alert}: severity {severity}");
            let summary = str_of(&r["annotations"]["summary"]);
            let description = str_of(&r["annotations"]["description"]);
            assert!(!summary.is_empty() && description.len() > 80, "{alert}: summary and description");
            assert!(
                !description.contains("{{`") && !description.contains("`}}"),
                "{alert}: Helm escapes left in {description}"
            );
            assert!(alerts.insert(alert.clone()), "{alert} twice");
        }
    }
    // The issue's list: pair not Live (nobody active / two active / other alarms), no
    // standby, flap suspension, key mismatch, VIP conflict, agent not reporting.
    for want in [
        "HavipPairNoActive",
        "HavipPairSplitActive",
        "HavipPairAlarm",
        "HavipPairNoStandby",
        "HavipPairSuspended",
        "HavipHeartbeatKeyMismatch",
        "HavipVipConflict",
        "HavipAgentDown",
        "HavipAgentsAbsent",
        "HavipOperatorNoLeader",
    ] {
        assert!(alerts.contains(want), "no alert {want}: {alerts:?}");
    }
    // Own selectors replace the defaults.
    let o = render(
        &helm,
        "havip-system",
        &["--set", "prometheusRule.enabled=true", "--set-string", r#"prometheusRule.agentSelector=job="node-havip""#],
    );
    let text = serde_yaml::to_string(o.one("PrometheusRule")).expect("yaml");
    assert!(text.contains(r#"havip_agent_role{job="node-havip",name="Active"}"#), "{text}");
    assert!(!text.contains("havip-agent-metrics"), "{text}");
}

#[test]
fn the_dashboard_parses_and_reads_only_exported_series() {
    let Some(helm) = helm() else { return };
    let exported = exported_series();
    let file = std::fs::read_to_string(chart().join("dashboards/havip.json")).expect("dashboard");
    let o = render(&helm, "havip-system", &[]);
    assert_eq!(o.of_kind("ConfigMap").count(), 0, "off by default");
    let o = render(&helm, "havip-system", &["--set", "grafanaDashboard.enabled=true"]);
    let cm = o.get("ConfigMap", "havip-dashboard");
    assert_eq!(string_map(&cm["metadata"]["labels"]).get("grafana_dashboard").map(String::as_str), Some("1"));
    assert_eq!(cm["metadata"]["namespace"].as_str(), Some("havip-system"));
    assert_eq!(str_of(&cm["data"]["havip.json"]).trim_end(), file.trim_end(), "the ConfigMap carries the file");
    let o = render(
        &helm,
        "havip-system",
        &[
            "--set",
            "grafanaDashboard.enabled=true",
            "--set",
            "grafanaDashboard.sidecarLabel=dashboards",
            "--set-string",
            "grafanaDashboard.sidecarLabelValue=havip",
            "--set-string",
            "grafanaDashboard.labels.team=net",
            "--set",
            "grafanaDashboard.namespace=monitoring",
            "--set-string",
            "grafanaDashboard.annotations.grafana_folder=Network",
        ],
    );
    let cm = o.get("ConfigMap", "havip-dashboard");
    let labels = string_map(&cm["metadata"]["labels"]);
    assert_eq!(labels.get("dashboards").map(String::as_str), Some("havip"));
    assert_eq!(labels.get("team").map(String::as_str), Some("net"));
    assert!(!labels.contains_key("grafana_dashboard"), "{labels:?}");
    assert_eq!(cm["metadata"]["namespace"].as_str(), Some("monitoring"));
    assert_eq!(string_map(&cm["metadata"]["annotations"]).get("grafana_folder").map(String::as_str), Some("Network"));

    let d: serde_json::Value = serde_json::from_str(&file).expect("the dashboard is JSON");
    assert_eq!(d["uid"].as_str(), Some("havip"));
    let vars: Vec<&serde_json::Value> = d["templating"]["list"].as_array().expect("templating").iter().collect();
    let var_names: BTreeSet<&str> = vars.iter().map(|v| v["name"].as_str().expect("variable name")).collect();
    assert_eq!(var_names, ["datasource", "namespace", "pair"].into());
    // Grafana's own and the dashboard's variables, as the queries use them, and what stands
    // in for each to parse the PromQL.
    let substitute = |q: &str| -> String {
        let mut q = q.replace("$__rate_interval", "5m");
        for v in &var_names {
            q = q.replace(&format!("${v}"), "x");
        }
        assert!(!q.contains('$'), "an unknown variable in {q}");
        q
    };
    let mut read = BTreeSet::new();
    for v in vars.iter().filter(|v| v["type"] == "query") {
        let q = v["query"]["query"].as_str().expect("query");
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|r| r.rsplit_once(", "))
            .map(|(series, _label)| series)
            .unwrap_or_else(|| panic!("variable query {q} is not label_values(series, label)"));
        read.extend(check_promql(&substitute(inner), &exported, &format!("variable {}", v["name"])));
        assert_eq!(v["datasource"]["uid"].as_str(), Some("${datasource}"));
    }
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut titles = Vec::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "panel id {} twice", p["id"]);
        for k in ["h", "w", "x", "y"] {
            assert!(p["gridPos"][k].is_u64(), "{}: gridPos.{k}", p["title"]);
        }
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().expect("title");
        titles.push(title);
        assert_eq!(p["datasource"]["uid"].as_str(), Some("${datasource}"), "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(refs.insert(t["refId"].as_str().expect("refId")), "{title}: refId twice");
            let expr = t["expr"].as_str().expect("expr");
            read.extend(check_promql(&substitute(expr), &exported, title));
        }
    }
    // What the issue asks for is there: pairs by phase (state), holders, failovers over
    // time, heartbeats, probe results.
    for want in [
        "Pairs by state",
        "Holders now",
        "Holder over time",
        "Failovers",
        "Heartbeats received per path",
        "Heartbeat round trip per path (p99)",
        "Pairs by phase",
        "Probe results",
    ] {
        assert!(titles.contains(&want), "no panel {want}: {titles:?}");
    }
    for series in [
        "havip_agent_role",
        "havip_agent_role_transitions_total",
        "havip_agent_heartbeats_received_total",
        "havip_agent_heartbeat_rtt_seconds_bucket",
        "havip_operator_pairs",
        "havip_agent_probes_total",
        "havip_agent_vips_held",
        "havip_operator_leader",
    ] {
        assert!(read.contains(series), "the dashboard never reads {series}");
    }
}

#[test]
fn an_overridden_render_applies_to_a_real_api_server() {
    use havip_e2e::controlplane::{ControlPlane, ControlPlaneOptions};
    let Some(helm) = helm() else { return };
    // Everything new at once (the monitoring objects aside: they need the Prometheus
    // Operator's CRDs), with the CRDs, applied server-side: the API server validates every
    // field (the probes' host, the budget's unhealthyPodEvictionPolicy, the label values).
    let text = template(
        &helm,
        "vips",
        &[
            "--include-crds",
            "--set",
            "fullnameOverride=acme-vip",
            "--set",
            "nameOverride=vip",
            "--set",
            "operator.priorityClassName=system-cluster-critical",
            "--set-string",
            "operator.podAnnotations.example\\.com/owner=net",
            "--set-string",
            "agent.podLabels.tier=node",
            "--set",
            "agent.metricsBindAddress=loopback",
            "--set",
            "grafanaDashboard.enabled=true",
        ],
    )
    .expect("render");
    let cp =
        ControlPlane::start(ControlPlaneOptions::default()).expect("control plane starts (run `make testbin` first)");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("render.yaml");
    std::fs::write(&file, &text).expect("write");
    let run = |args: &[&str]| {
        let out = cp.kubectl().args(args).output().expect("kubectl");
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&["create", "namespace", "vips"]);
    let applied = run(&["apply", "--server-side", "--field-manager=helm", "-f", file.to_str().expect("path")]);
    for want in [
        "poddisruptionbudget.policy/acme-vip-operator serverside-applied",
        "daemonset.apps/acme-vip-agent serverside-applied",
        "deployment.apps/acme-vip-operator serverside-applied",
        "configmap/acme-vip-dashboard serverside-applied",
        "validatingadmissionpolicy.admissionregistration.k8s.io/acme-vip-agent-pair-leases serverside-applied",
        "customresourcedefinition.apiextensions.k8s.io/hapairs.havip.io serverside-applied",
    ] {
        assert!(applied.contains(want), "{want} missing in:\n{applied}");
    }
    let probe = run(&[
        "-n",
        "vips",
        "get",
        "ds",
        "acme-vip-agent",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].livenessProbe.httpGet.host}",
    ]);
    assert_eq!(probe, "127.0.0.1");
}

/// promtool (built from Prometheus's Go module by hack/testbin.sh), or `None` with the
/// reason printed.
fn promtool() -> Option<PathBuf> {
    let out = Command::new("bash").arg(repo().join("hack/testbin.sh")).arg("promtool").output().ok()?;
    if !out.status.success() {
        eprintln!("SKIPPED: promtool cannot be built: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    let dir = String::from_utf8_lossy(&out.stdout).lines().last().map(PathBuf::from)?;
    Some(dir.join("promtool")).filter(|p| p.is_file())
}

/// An expected alert's labels besides `alertname` and the rule's own.
type Labels = &'static [(&'static str, &'static str)];

/// One `promtool test rules` case: input series (`series`, `values`) and, per evaluation
/// time, the alerts expected (their labels besides `alertname` and the rule's own).
struct AlertCase {
    alert: &'static str,
    series: &'static [(&'static str, &'static str)],
    evals: &'static [(&'static str, &'static [Labels])],
}

const A: &str = r#"job="havip-agent-metrics",namespace="havip-system""#;
const O: &str = r#"job="havip-operator-metrics",namespace="havip-system""#;

/// Every alert: it fires when its condition held for its `for:`, not before, and not for
/// what is healthy next to it (a pair with one active and one standby, another alarm).
const ALERT_CASES: &[AlertCase] = &[
    AlertCase {
        alert: "HavipPairNoActive",
        series: &[
            (r#"havip_agent_role{$A,pair="web",node="a",name="Active"}"#, "0x15"),
            (r#"havip_agent_role{$A,pair="web",node="b",name="Active"}"#, "0x15"),
            (r#"havip_agent_role{$A,pair="db",node="a",name="Active"}"#, "1x15"),
            (r#"havip_agent_role{$A,pair="db",node="b",name="Active"}"#, "0x15"),
        ],
        evals: &[("30s", &[]), ("2m", &[&[("pair", "web")]])],
    },
    AlertCase {
        alert: "HavipPairSplitActive",
        series: &[
            (r#"havip_agent_role{$A,pair="web",node="a",name="Active"}"#, "1x15"),
            (r#"havip_agent_role{$A,pair="web",node="b",name="Active"}"#, "1x15"),
            (r#"havip_agent_role{$A,pair="db",node="a",name="Active"}"#, "1x15"),
        ],
        evals: &[("30s", &[]), ("2m", &[&[("pair", "web")]])],
    },
    AlertCase {
        alert: "HavipPairNoStandby",
        series: &[
            (r#"havip_agent_role{$A,pair="web",node="a",name="Active"}"#, "1x15"),
            (r#"havip_agent_role{$A,pair="web",node="b",name="Standby"}"#, "0x15"),
            (r#"havip_agent_role{$A,pair="db",node="a",name="Active"}"#, "1x15"),
            (r#"havip_agent_role{$A,pair="db",node="b",name="Standby"}"#, "1x15"),
        ],
        evals: &[("9m", &[]), ("11m", &[&[("pair", "web")]])],
    },
    AlertCase {
        alert: "HavipPairSuspended",
        series: &[
            (r#"havip_agent_alarms{$A,pair="web",node="a",name="Suspended"}"#, "1x15"),
            (r#"havip_agent_alarms{$A,pair="db",node="a",name="Suspended"}"#, "0x15"),
        ],
        evals: &[("30s", &[]), ("2m", &[&[("pair", "web")]])],
    },
    AlertCase {
        alert: "HavipHeartbeatKeyMismatch",
        series: &[
            (r#"havip_agent_alarms{$A,pair="web",node="b",name="KeyMismatch"}"#, "1x15"),
            (r#"havip_agent_alarms{$A,pair="web",node="a",name="KeyMismatch"}"#, "0x15"),
        ],
        evals: &[("4m", &[]), ("6m", &[&[("pair", "web"), ("node", "b")]])],
    },
    AlertCase {
        alert: "HavipVipConflict",
        series: &[(r#"havip_agent_alarms{$A,pair="web",node="a",name="VipConflict"}"#, "1x15")],
        evals: &[("30s", &[]), ("2m", &[&[("pair", "web"), ("node", "a")]])],
    },
    AlertCase {
        alert: "HavipPairAlarm",
        series: &[
            (r#"havip_agent_alarms{$A,pair="web",node="a",name="PeerSilent"}"#, "1x15"),
            // The three with alerts of their own are not repeated here.
            (r#"havip_agent_alarms{$A,pair="web",node="a",name="KeyMismatch"}"#, "1x15"),
            (r#"havip_agent_alarms{$A,pair="web",node="a",name="VipConflict"}"#, "1x15"),
            (r#"havip_agent_alarms{$A,pair="web",node="b",name="ClockSkew"}"#, "0x15"),
        ],
        evals: &[("4m", &[]), ("6m", &[&[("pair", "web"), ("node", "a"), ("name", "PeerSilent")]])],
    },
    AlertCase {
        alert: "HavipAgentDown",
        series: &[(r#"up{$A,instance="10.0.0.1:9797"}"#, "0x15"), (r#"up{$A,instance="10.0.0.2:9797"}"#, "1x15")],
        evals: &[
            ("4m", &[]),
            ("6m", &[&[("job", "havip-agent-metrics"), ("namespace", "havip-system"), ("instance", "10.0.0.1:9797")]]),
        ],
    },
    AlertCase {
        alert: "HavipAgentsAbsent",
        series: &[(r#"up{$O,instance="10.0.0.9:8080"}"#, "1x20")],
        evals: &[("14m", &[]), ("16m", &[&[("job", "havip-agent-metrics"), ("namespace", "havip-system")]])],
    },
    AlertCase {
        alert: "HavipOperatorNoLeader",
        series: &[
            (r#"havip_operator_leader{$O,pod="op-0"}"#, "1x3 0x12"),
            (r#"havip_operator_leader{$O,pod="op-1"}"#, "0x15"),
        ],
        // Led for 3 minutes, then nobody: fires 5 minutes after the last leader left.
        evals: &[("2m", &[]), ("7m", &[]), ("10m", &[&[]])],
    },
];

/// The alert rules as `helm template` renders them, annotations left out (promtool compares
/// them whole; their templates are checked by `promtool check rules` on the full file).
fn rendered_rule_groups(helm: &Path) -> (Value, Value) {
    let o = render(helm, "havip-system", &["--set", "prometheusRule.enabled=true"]);
    let full = o.get("PrometheusRule", "havip")["spec"].clone();
    let mut bare = full.clone();
    for g in bare["groups"].as_sequence_mut().expect("groups") {
        for r in g["rules"].as_sequence_mut().expect("rules") {
            if let Some(m) = r.as_mapping_mut() {
                m.remove("annotations");
            }
        }
    }
    (full, bare)
}

#[test]
fn promtool_evaluates_every_alert_rule_as_its_tests_expect() {
    let Some(helm) = helm() else { return };
    let Some(promtool) = promtool() else { return };
    let (full, bare) = rendered_rule_groups(&helm);
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("full.yaml"), serde_yaml::to_string(&full).expect("yaml")).expect("write");
    std::fs::write(dir.path().join("rules.yaml"), serde_yaml::to_string(&bare).expect("yaml")).expect("write");
    let check = Command::new(&promtool).arg("check").arg("rules").arg(dir.path().join("full.yaml")).output();
    let check = check.expect("promtool runs");
    assert!(
        check.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    // The rules' own labels (severity), added to every expected alert.
    let mut rule_labels: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for g in bare["groups"].as_sequence().expect("groups") {
        for r in g["rules"].as_sequence().expect("rules") {
            let labels = string_map(&r["labels"]).into_iter().collect();
            rule_labels.insert(str_of(&r["alert"]).to_owned(), labels);
        }
    }
    let covered: BTreeSet<&str> = ALERT_CASES.iter().map(|c| c.alert).collect();
    let defined: BTreeSet<&str> = rule_labels.keys().map(String::as_str).collect();
    assert_eq!(covered, defined, "every alert rule has a promtool test, and only those");
    let mut tests = Vec::new();
    for c in ALERT_CASES {
        let input: Vec<serde_json::Value> = c
            .series
            .iter()
            .map(|(s, v)| {
                let s = s.replace("$A", A).replace("$O", O);
                serde_json::json!({"series": s, "values": v})
            })
            .collect();
        let evals: Vec<serde_json::Value> = c
            .evals
            .iter()
            .map(|(at, alerts)| {
                let exp: Vec<serde_json::Value> = alerts
                    .iter()
                    .map(|labels| {
                        let mut all: BTreeMap<String, String> =
                            labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
                        all.extend(rule_labels[c.alert].iter().cloned());
                        serde_json::json!({"exp_labels": all})
                    })
                    .collect();
                serde_json::json!({"eval_time": at, "alertname": c.alert, "exp_alerts": exp})
            })
            .collect();
        tests.push(
            serde_json::json!({"name": c.alert, "interval": "1m", "input_series": input, "alert_rule_test": evals}),
        );
    }
    let file = serde_json::json!({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests});
    std::fs::write(dir.path().join("tests.yaml"), serde_yaml::to_string(&file).expect("yaml")).expect("write");
    let out = Command::new(&promtool)
        .current_dir(dir.path())
        .args(["test", "rules", "tests.yaml"])
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
