//! Pod templates against a real kube-apiserver: with restricted templates on, each kind of host access
//! or privilege is refused with a `TemplateRefused` condition and no workers; an ordinary template (and
//! the same one with the operator's restriction off) gets its Deployment, whose security settings are
//! the template's merged field by field over the restricted defaults; with worker NetworkPolicies on,
//! each consumer gets one the API server takes, selecting its pods and their named ports.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::{Patch, PatchParams};
use leasehold_operator::context::MetricsScrapers;
use serde_json::json;
use support::{TestNamespace, aws, wait};

const SLOW: Duration = Duration::from_secs(30);

fn spec(stream: &str, template: serde_json::Value) -> serde_json::Value {
    json!({"streams": [{"name": stream}], "aws": aws(), "workers": {"replicas": 1},
           "processor": {"stdout": {}}, "template": template})
}

async fn workers(ns: &TestNamespace, consumer: &str) -> Option<Deployment> {
    ns.deployments().get_opt(&format!("{consumer}-workers")).await.expect("get deployment")
}

#[tokio::test]
async fn restricted_templates_refuse_host_access_and_privilege_in_status() {
    let ns = TestNamespace::with_settings("op-restrict", |s| s.restrict_templates = true).await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-restrict", 1).await;
    let cases = [
        ("host-network", json!({"spec": {"hostNetwork": true, "containers": []}}), "hostNetwork"),
        ("host-pid", json!({"spec": {"hostPID": true, "containers": []}}), "hostPID"),
        (
            "host-path",
            json!({"spec": {"containers": [], "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}}),
            "hostPath",
        ),
        (
            "privileged",
            json!({"spec": {"containers": [{"name": "sidecar", "image": "busybox", "securityContext": {"privileged": true}}]}}),
            "privileged",
        ),
    ];
    for (name, template, _) in &cases {
        ns.create(name, spec(&stream, template.clone())).await.expect("the API server takes the template");
    }
    for (name, _, field) in &cases {
        wait(&format!("{name}: Ready False TemplateRefused"), SLOW, async || {
            ns.condition(name, "Ready").await == Some(("False".into(), "TemplateRefused".into()))
        })
        .await;
        let message = ns
            .consumers()
            .get(name)
            .await
            .expect("consumer")
            .status
            .expect("status")
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.message)
            .unwrap_or_default();
        assert!(message.contains(field), "{name}: the condition names {field}: {message}");
        assert!(workers(&ns, name).await.is_none(), "{name}: no workers for a refused template");
    }
    // Mended, the same consumer gets its workers.
    ns.consumers()
        .patch(
            "host-network",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"hostNetwork": null}}}})),
        )
        .await
        .expect("patch");
    wait("workers once the template is mended", SLOW, async || workers(&ns, "host-network").await.is_some()).await;
}

#[tokio::test]
async fn template_security_settings_merge_with_the_restricted_defaults() {
    let ns = TestNamespace::new("op-secmerge").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-secmerge", 1).await;
    // The template sets one field of each security context; the rest must keep the restricted defaults.
    let template = json!({"spec": {
        "securityContext": {"runAsUser": 1000},
        "containers": [{"name": "worker", "securityContext": {"runAsUser": 1000}}]
    }});
    ns.create("merged", spec(&stream, template)).await.expect("create");
    wait("workers", SLOW, async || workers(&ns, "merged").await.is_some()).await;
    let pod = workers(&ns, "merged").await.and_then(|d| d.spec?.template.spec).expect("pod spec");
    let pod_security = pod.security_context.expect("pod securityContext");
    assert_eq!(pod_security.run_as_user, Some(1000));
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(pod_security.seccomp_profile.map(|s| s.type_), Some("RuntimeDefault".to_string()));
    let worker = pod.containers.iter().find(|c| c.name == "worker").expect("worker container");
    let security = worker.security_context.clone().expect("container securityContext");
    assert_eq!(security.run_as_user, Some(1000));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.capabilities.and_then(|c| c.drop), Some(vec!["ALL".to_string()]));
    assert_eq!(security.seccomp_profile.map(|s| s.type_), Some("RuntimeDefault".to_string()));
}

#[tokio::test]
async fn with_worker_network_policies_each_consumer_gets_one_the_api_server_takes() {
    let scrapers = MetricsScrapers::parse("kubernetes.io/metadata.name=monitoring", "app=prometheus").unwrap();
    let ns = TestNamespace::with_settings("op-netpol", |s| s.worker_network_policy = Some(scrapers)).await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-netpol", 1).await;
    ns.create("orders", spec(&stream, json!({}))).await.expect("create");
    let policies = Api::<NetworkPolicy>::namespaced(ns.client.clone(), &ns.name);
    wait("the workers' NetworkPolicy", SLOW, async || {
        policies.get_opt("orders-workers").await.ok().flatten().is_some()
    })
    .await;
    let policy = policies.get("orders-workers").await.expect("policy").spec.expect("spec");
    let deployment = workers(&ns, "orders").await.expect("workers");
    let pod_labels = deployment.spec.and_then(|s| s.template.metadata).and_then(|m| m.labels).expect("pod labels");
    // It selects exactly the consumer's worker pods, and lets the handoff port in from them alone.
    let selected = policy.pod_selector.and_then(|s| s.match_labels).expect("pod selector");
    assert!(selected.iter().all(|(k, v)| pod_labels.get(k) == Some(v)), "{selected:?} ⊆ {pod_labels:?}");
    let ingress = policy.ingress.expect("ingress");
    let handoff = ingress
        .iter()
        .find(|r| r.ports.iter().flatten().any(|p| p.port == Some(IntOrString::String("handoff".into()))));
    let from = handoff.and_then(|r| r.from.clone()).expect("handoff from");
    assert_eq!(from[0].pod_selector.as_ref().and_then(|s| s.match_labels.clone()), Some(selected.clone()));
    // The worker container names both ports the policy opens.
    let pod = workers(&ns, "orders").await.and_then(|d| d.spec?.template.spec).expect("pod spec");
    let ports: Vec<String> = pod.containers[0].ports.iter().flatten().filter_map(|p| p.name.clone()).collect();
    assert!(ports.contains(&"handoff".to_string()) && ports.contains(&"metrics".to_string()), "{ports:?}");
    assert_eq!(policy.policy_types, Some(vec!["Ingress".to_string()]));
}

#[tokio::test]
async fn without_the_setting_no_network_policy_is_made() {
    let ns = TestNamespace::new("op-nonetpol").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-nonetpol", 1).await;
    ns.create("orders", spec(&stream, json!({}))).await.expect("create");
    wait("workers", SLOW, async || workers(&ns, "orders").await.is_some()).await;
    let policies = Api::<NetworkPolicy>::namespaced(ns.client.clone(), &ns.name);
    assert!(policies.get_opt("orders-workers").await.expect("get").is_none());
}
