//! Desired objects from a StreamConsumer and what was observed: pure, no client, unit-tested.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PodSecurityContext, PodTemplateSpec, Probe, SeccompProfile, Secret, SecretVolumeSource,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use leasehold_crds::{ResolvedSpec, StreamConsumer, StreamConsumerSpec};
use md5::{Digest, Md5};
use std::time::Duration;

/// Label naming the consumer a worker pod belongs to.
pub const CONSUMER_LABEL: &str = "leasehold.io/consumer";
/// Annotation carrying the hash of the worker config, so a spec change rolls the workers.
pub const CONFIG_HASH_ANNOTATION: &str = "leasehold.io/config-hash";
/// Key of the worker config in the ConfigMap.
pub const CONFIG_KEY: &str = "worker.yaml";
/// Name of the pod volume carrying the worker config.
pub const CONFIG_VOLUME: &str = "worker-config";
/// Where the worker config is mounted in the worker container.
pub const CONFIG_DIR: &str = "/etc/leasehold";
/// Port of the worker's /metrics, /healthz and /readyz.
pub const WORKER_METRICS_PORT: i32 = 9090;
/// Port of the worker's handoff notice endpoint (named `handoff`; a NetworkPolicy opens it to the
/// consumer's own pods).
pub const WORKER_HANDOFF_PORT: i32 = 9091;
/// Key of the handoff secret in its Secret.
pub const HANDOFF_SECRET_KEY: &str = "secret";
/// Name of the pod volume carrying the handoff secret.
pub const HANDOFF_SECRET_VOLUME: &str = "handoff-secret";
/// Where the handoff secret is mounted in the worker container.
pub const HANDOFF_SECRET_DIR: &str = "/etc/leasehold/handoff";
/// Name of the worker container (a container of this name in `spec.template` is merged with it).
pub const WORKER_CONTAINER: &str = "worker";

/// Seconds a worker pod gets beyond `lease.gracefulTimeout` between SIGTERM and SIGKILL: the graceful
/// timeout bounds the in-flight records; the margin covers the lease releases and the exit after it.
pub const TERMINATION_MARGIN_SECONDS: i64 = 5;

/// The objects a reconcile applies for one consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// Desired workers.
    pub replicas: i32,
    /// The worker config.
    pub config_map: ConfigMap,
    /// The workers.
    pub deployment: Deployment,
}

impl Desired {
    /// Name of both objects.
    pub fn name(&self) -> &str {
        self.deployment.metadata.name.as_deref().unwrap_or_default()
    }
}

/// The ConfigMap and Deployment of `consumer` with `replicas` workers (stage 4 of the pipeline).
pub fn desired(
    consumer: &StreamConsumer,
    replicas: i32,
    resolved: &ResolvedSpec,
    image: &str,
) -> Result<Desired, serde_yaml_ng::Error> {
    let config = worker_config(&worker_spec(consumer))?;
    let hash = config_hash(&config);
    Ok(Desired {
        replicas,
        config_map: config_map(consumer, &config),
        deployment: deployment(
            consumer,
            replicas,
            image,
            &hash,
            termination_grace_period(resolved.durations.graceful_timeout),
        ),
    })
}

/// `terminationGracePeriodSeconds` of the worker pods: `gracefulTimeout` rounded up to whole seconds,
/// plus [`TERMINATION_MARGIN_SECONDS`].
pub fn termination_grace_period(graceful_timeout: Duration) -> i64 {
    let whole = graceful_timeout.as_secs() + u64::from(graceful_timeout.subsec_nanos() > 0);
    i64::try_from(whole).unwrap_or(i64::MAX).saturating_add(TERMINATION_MARGIN_SECONDS)
}

/// Name of the ConfigMap and Deployment of a consumer.
pub fn workers_name(consumer: &StreamConsumer) -> String {
    format!("{}-workers", consumer.name_any())
}

/// The label selector of every object the operator makes (Deployments, ConfigMaps): its watches see only
/// those, not every Deployment and ConfigMap of the cluster.
pub const OWNED_SELECTOR: &str = "app.kubernetes.io/managed-by=leasehold-operator";

/// Name of the Secret holding the consumer's handoff secret, which its workers sign notices with.
pub fn handoff_secret_name(consumer: &StreamConsumer) -> String {
    format!("{}-handoff", consumer.name_any())
}

/// The Secret holding `secret` (random, made once: see `pipeline::apply`), owned by `consumer`.
pub fn handoff_secret(consumer: &StreamConsumer, secret: String) -> Secret {
    let mut metadata = owned_meta(consumer);
    metadata.name = Some(handoff_secret_name(consumer));
    Secret {
        metadata,
        type_: Some("Opaque".into()),
        string_data: Some(BTreeMap::from([(HANDOFF_SECRET_KEY.to_string(), secret)])),
        ..Secret::default()
    }
}

/// A fresh handoff secret: 32 random bytes, hex.
pub fn new_handoff_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Labels on every worker pod of `consumer`.
pub fn worker_labels(consumer: &StreamConsumer) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "leasehold-worker".to_string()),
        ("app.kubernetes.io/instance".to_string(), consumer.name_any()),
        ("app.kubernetes.io/managed-by".to_string(), "leasehold-operator".to_string()),
        (CONSUMER_LABEL.to_string(), consumer.name_any()),
    ])
}

/// The label selector of the worker pods, as the scale subresource reports it.
pub fn selector(consumer: &StreamConsumer) -> String {
    format!("app.kubernetes.io/name=leasehold-worker,{CONSUMER_LABEL}={}", consumer.name_any())
}

/// How many workers should run: 0 while paused; with autoscaling clamp(ceil(open shards / shards per
/// worker), min, max) (min while the shard count is unknown); else `workers.replicas` (default 1).
pub fn desired_replicas(spec: &StreamConsumerSpec, open_shards: Option<i32>) -> i32 {
    if spec.paused == Some(true) {
        return 0;
    }
    match &spec.workers.autoscaling {
        Some(auto) => {
            let min = auto.min_replicas.unwrap_or(1).max(0);
            let max = auto.max_replicas.max(min);
            let per = auto.shards_per_worker.max(1);
            match open_shards {
                Some(open) => (open.max(0) + per - 1) / per,
                None => min,
            }
            .clamp(min, max)
        }
        None => spec.workers.replicas.unwrap_or(1).max(0),
    }
}

/// The spec the workers get: with `reader.mode: fanOut` and no `reader.consumerName`, the name of the
/// stream consumer the operator registers (`<namespace>.<name>`) written out, since a worker on its own
/// would default to the lease table's name. Polling specs are passed as they are (their config, and so
/// their pods, do not change).
pub fn worker_spec(consumer: &StreamConsumer) -> StreamConsumerSpec {
    let mut spec = consumer.spec.clone();
    let fan_out = spec.reader.mode.unwrap_or_default() == leasehold_crds::ReaderMode::FanOut;
    if let (true, None, Some(namespace)) = (fan_out, &spec.reader.consumer_name, consumer.namespace()) {
        spec.reader.consumer_name = Some(spec.consumer_name(Some((&namespace, &consumer.name_any()))));
    }
    crate::window::pin_for_workers(consumer, &mut spec);
    spec
}

/// The worker configuration file: the spec without the pod template (which concerns the pods, not the
/// worker process).
pub fn worker_config(spec: &StreamConsumerSpec) -> Result<String, serde_yaml_ng::Error> {
    let mut spec = spec.clone();
    spec.template = None;
    serde_yaml_ng::to_string(&spec)
}

/// A short stable hash of the worker config.
pub fn config_hash(config: &str) -> String {
    let digest = Md5::digest(config.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The metadata of an object the operator makes for `consumer`: named after its workers, labelled,
/// owned by it.
pub fn owned_meta(consumer: &StreamConsumer) -> ObjectMeta {
    ObjectMeta {
        name: Some(workers_name(consumer)),
        namespace: consumer.namespace(),
        labels: Some(worker_labels(consumer)),
        owner_references: consumer.controller_owner_ref(&()).map(|r| vec![r]),
        ..ObjectMeta::default()
    }
}

/// The ConfigMap holding the worker config.
pub fn config_map(consumer: &StreamConsumer, config: &str) -> ConfigMap {
    ConfigMap {
        metadata: owned_meta(consumer),
        data: Some(BTreeMap::from([(CONFIG_KEY.to_string(), config.to_string())])),
        ..ConfigMap::default()
    }
}

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile { type_: "RuntimeDefault".into(), ..SeccompProfile::default() }
}

/// The template's container security settings over the restricted defaults, field by field: what the
/// template sets wins, every field it leaves out keeps the restricted default (Pod Security `restricted`).
fn restricted_container_security(template: Option<SecurityContext>) -> SecurityContext {
    let mut security = template.unwrap_or_default();
    security.allow_privilege_escalation.get_or_insert(false);
    security.read_only_root_filesystem.get_or_insert(true);
    security.run_as_non_root.get_or_insert(true);
    security.capabilities.get_or_insert_with(Capabilities::default).drop.get_or_insert_with(|| vec!["ALL".into()]);
    security.seccomp_profile.get_or_insert_with(runtime_default_seccomp);
    security
}

/// The template's pod security settings over the restricted defaults, field by field.
fn restricted_pod_security(template: Option<PodSecurityContext>) -> PodSecurityContext {
    let mut security = template.unwrap_or_default();
    security.run_as_non_root.get_or_insert(true);
    security.seccomp_profile.get_or_insert_with(runtime_default_seccomp);
    security
}

/// An environment variable holding a field of the pod (the downward API).
fn pod_field(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: field_path.into(), ..ObjectFieldSelector::default() }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// The worker container, merged over a container named `worker` in the user's template if any.
fn worker_container(base: Option<Container>, image: &str) -> Container {
    let mut container = base.unwrap_or_default();
    container.name = WORKER_CONTAINER.into();
    if container.image.is_none() {
        container.image = Some(image.into());
    }
    // The pod name is a stable owner id: a restarted pod retakes its own leases at once. Handoff
    // notices are taken on a port of their own, signed with the consumer's secret.
    container.args = Some(vec![
        "--config".into(),
        format!("{CONFIG_DIR}/{CONFIG_KEY}"),
        "--owner-id".into(),
        "$(POD_NAME)".into(),
        "--handoff-addr".into(),
        format!("0.0.0.0:{WORKER_HANDOFF_PORT}"),
        "--handoff-secret-file".into(),
        format!("{HANDOFF_SECRET_DIR}/{HANDOFF_SECRET_KEY}"),
    ]);
    let mut env = container.env.take().unwrap_or_default();
    env.retain(|e| e.name != "POD_NAME" && e.name != "POD_IP");
    env.push(pod_field("POD_NAME", "metadata.name"));
    // Where peers reach this worker's endpoints: it advertises `$POD_IP:<port>` for handoff notices.
    env.push(pod_field("POD_IP", "status.podIP"));
    container.env = Some(env);
    let mut mounts = container.volume_mounts.take().unwrap_or_default();
    mounts.retain(|m| m.name != CONFIG_VOLUME && m.name != HANDOFF_SECRET_VOLUME);
    mounts.push(VolumeMount {
        name: CONFIG_VOLUME.into(),
        mount_path: CONFIG_DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    });
    mounts.push(VolumeMount {
        name: HANDOFF_SECRET_VOLUME.into(),
        mount_path: HANDOFF_SECRET_DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    });
    container.volume_mounts = Some(mounts);
    container.security_context = Some(restricted_container_security(container.security_context.take()));
    // The worker serves /metrics, /healthz and /readyz on 9090 by default.
    let mut ports = container.ports.take().unwrap_or_default();
    if !ports.iter().any(|p| p.name.as_deref() == Some("metrics")) {
        ports.push(ContainerPort {
            name: Some("metrics".into()),
            container_port: WORKER_METRICS_PORT,
            ..ContainerPort::default()
        });
    }
    if !ports.iter().any(|p| p.name.as_deref() == Some("handoff")) {
        ports.push(ContainerPort {
            name: Some("handoff".into()),
            container_port: WORKER_HANDOFF_PORT,
            ..ContainerPort::default()
        });
    }
    container.ports = Some(ports);
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("metrics".into()),
            ..HTTPGetAction::default()
        }),
        ..Probe::default()
    };
    container.readiness_probe.get_or_insert_with(|| probe("/readyz"));
    container.liveness_probe.get_or_insert_with(|| probe("/healthz"));
    container
}

/// The worker Deployment: `spec.template` merged with the worker container, config volume, labels,
/// restricted security defaults, no Kubernetes API token, and `grace_seconds` to stop in (unless the
/// template sets `terminationGracePeriodSeconds`).
pub fn deployment(
    consumer: &StreamConsumer,
    replicas: i32,
    image: &str,
    config_hash: &str,
    grace_seconds: i64,
) -> Deployment {
    let labels = worker_labels(consumer);
    let template = consumer.spec.template.clone().unwrap_or_default();
    let mut meta = template.metadata.unwrap_or_default();
    meta.labels.get_or_insert_with(BTreeMap::new).extend(labels.clone());
    meta.annotations.get_or_insert_with(BTreeMap::new).insert(CONFIG_HASH_ANNOTATION.into(), config_hash.into());
    let mut pod = template.spec.unwrap_or_default();
    let mut containers = std::mem::take(&mut pod.containers);
    let base = containers.iter().position(|c| c.name == WORKER_CONTAINER).map(|i| containers.remove(i));
    containers.insert(0, worker_container(base, image));
    pod.containers = containers;
    let mut volumes = pod.volumes.take().unwrap_or_default();
    volumes.retain(|v| v.name != CONFIG_VOLUME && v.name != HANDOFF_SECRET_VOLUME);
    volumes.push(Volume {
        name: CONFIG_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource { name: workers_name(consumer), ..ConfigMapVolumeSource::default() }),
        ..Volume::default()
    });
    volumes.push(Volume {
        name: HANDOFF_SECRET_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(handoff_secret_name(consumer)),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    });
    pod.volumes = Some(volumes);
    if pod.automount_service_account_token.is_none() {
        pod.automount_service_account_token = Some(false);
    }
    pod.security_context = Some(restricted_pod_security(pod.security_context.take()));
    // Leases move gracefully on SIGTERM; the kubelet must not kill the worker while it drains.
    pod.termination_grace_period_seconds.get_or_insert(grace_seconds);
    Deployment {
        metadata: owned_meta(consumer),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector { match_labels: Some(labels), ..LabelSelector::default() },
            template: PodTemplateSpec { metadata: Some(meta), spec: Some(pod) },
            // One worker at a time: each new pod takes leases from running ones by handoff.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_crds::{AutoscalingSpec, WorkersSpec};

    fn consumer(yaml: &str) -> StreamConsumer {
        let spec: StreamConsumerSpec = serde_yaml_ng::from_str(yaml).expect("spec");
        let mut consumer = StreamConsumer::new("orders", spec);
        consumer.metadata.namespace = Some("shop".into());
        consumer.metadata.uid = Some("uid-1".into());
        consumer
    }

    const BASE: &str = "streams: [{name: orders}]\nleaseTable: {name: orders-leases}\nprocessor: {stdout: {}}\n";

    #[test]
    fn replicas_follow_the_spec_shape() {
        let fixed =
            StreamConsumerSpec { workers: WorkersSpec { replicas: Some(3), autoscaling: None }, ..Default::default() };
        assert_eq!(desired_replicas(&fixed, Some(100)), 3);
        assert_eq!(desired_replicas(&StreamConsumerSpec::default(), None), 1, "default one worker");
        let auto = |min, max, per| StreamConsumerSpec {
            workers: WorkersSpec {
                replicas: None,
                autoscaling: Some(AutoscalingSpec {
                    shards_per_worker: per,
                    min_replicas: min,
                    max_replicas: max,
                    lag: None,
                }),
            },
            ..Default::default()
        };
        assert_eq!(desired_replicas(&auto(Some(1), 20, 2), Some(5)), 3, "ceil(5 / 2)");
        assert_eq!(desired_replicas(&auto(Some(1), 2, 2), Some(50)), 2, "clamped to max");
        assert_eq!(desired_replicas(&auto(Some(4), 20, 2), Some(2)), 4, "clamped to min");
        assert_eq!(desired_replicas(&auto(None, 20, 1), None), 1, "unknown shard count: min");
        let paused = StreamConsumerSpec { paused: Some(true), ..fixed };
        assert_eq!(desired_replicas(&paused, Some(10)), 0);
    }

    #[test]
    fn fan_out_workers_are_told_the_registered_consumer_name() {
        let fan_out = consumer(&format!("{BASE}reader: {{mode: fanOut}}\n"));
        assert_eq!(worker_spec(&fan_out).reader.consumer_name.as_deref(), Some("shop.orders"));
        let named = consumer(&format!("{BASE}reader: {{mode: fanOut, consumerName: mine}}\n"));
        assert_eq!(worker_spec(&named).reader.consumer_name.as_deref(), Some("mine"));
        let polling = consumer(BASE);
        assert_eq!(worker_spec(&polling), polling.spec, "a polling spec is passed as it is");
    }

    #[test]
    fn config_map_carries_the_spec_without_the_template() {
        let c = consumer(&format!("{BASE}template: {{spec: {{serviceAccountName: orders-sa}}}}\n"));
        let config = worker_config(&c.spec).unwrap();
        assert!(config.contains("orders-leases") && !config.contains("orders-sa"), "{config}");
        let parsed: StreamConsumerSpec = serde_yaml_ng::from_str(&config).expect("the worker can read it");
        assert_eq!(parsed.streams, c.spec.streams);
        let cm = config_map(&c, &config);
        assert_eq!(cm.metadata.name.as_deref(), Some("orders-workers"));
        assert_eq!(cm.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
        assert_eq!(cm.data.unwrap()[CONFIG_KEY], config);
    }

    #[test]
    fn the_worker_config_keeps_the_http_batch_settings() {
        let c = consumer(
            "streams: [{name: orders}]\nprocessor: {http: {url: 'http://localhost:8080/', \
             batch: {maxRecords: 50, maxDelay: 10ms}}}\n",
        );
        let parsed: StreamConsumerSpec = serde_yaml_ng::from_str(&worker_config(&c.spec).unwrap()).expect("parses");
        assert_eq!(parsed.processor, c.spec.processor, "the worker sees the batch settings as written");
    }

    #[test]
    fn deployment_runs_the_worker_with_its_config_and_owner() {
        let c = consumer(BASE);
        let d = deployment(&c, 2, "leasehold/worker:1", "abc", 10);
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(d.metadata.owner_references.as_ref().unwrap()[0].kind, "StreamConsumer");
        assert_eq!(d.metadata.owner_references.as_ref().unwrap()[0].controller, Some(true));
        let pod = spec.template.spec.as_ref().unwrap();
        let worker = &pod.containers[0];
        assert_eq!(worker.image.as_deref(), Some("leasehold/worker:1"));
        assert_eq!(
            worker.args.as_ref().unwrap(),
            &[
                "--config",
                "/etc/leasehold/worker.yaml",
                "--owner-id",
                "$(POD_NAME)",
                "--handoff-addr",
                "0.0.0.0:9091",
                "--handoff-secret-file",
                "/etc/leasehold/handoff/secret"
            ]
        );
        let handoff = worker.ports.as_ref().unwrap().iter().find(|p| p.name.as_deref() == Some("handoff"));
        assert_eq!(handoff.map(|p| p.container_port), Some(WORKER_HANDOFF_PORT), "a named port for NetworkPolicies");
        let secret = pod.volumes.as_ref().unwrap().iter().find(|v| v.name == HANDOFF_SECRET_VOLUME).unwrap();
        assert_eq!(secret.secret.as_ref().unwrap().secret_name.as_deref(), Some("orders-handoff"));
        assert!(worker.volume_mounts.as_ref().unwrap().iter().any(|m| m.mount_path == HANDOFF_SECRET_DIR));
        assert_eq!(pod.automount_service_account_token, Some(false), "workers get no API token");
        assert_eq!(worker.ports.as_ref().unwrap()[0].container_port, WORKER_METRICS_PORT);
        let readiness = worker.readiness_probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(readiness.path.as_deref(), Some("/readyz"));
        assert_eq!(worker.security_context.as_ref().unwrap().read_only_root_filesystem, Some(true));
        let annotations = spec.template.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
        assert_eq!(annotations[CONFIG_HASH_ANNOTATION], "abc");
        assert_eq!(spec.selector.match_labels.as_ref().unwrap()[CONSUMER_LABEL], "orders");
    }

    #[test]
    fn the_template_is_merged_not_replaced() {
        let c = consumer(&format!(
            "{BASE}template:\n  metadata: {{labels: {{team: payments}}}}\n  spec:\n    serviceAccountName: reader\n    containers:\n    \
             - {{name: worker, image: mine:2, resources: {{limits: {{memory: 64Mi}}}}}}\n    - {{name: sidecar, image: app:1}}\n"
        ));
        let d = deployment(&c, 1, "leasehold/worker:1", "abc", 10);
        let template = &d.spec.as_ref().unwrap().template;
        let pod = template.spec.as_ref().unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("reader"));
        assert_eq!(pod.containers.len(), 2);
        assert_eq!(pod.containers[0].image.as_deref(), Some("mine:2"), "the user's image wins");
        assert!(pod.containers[0].resources.is_some());
        assert_eq!(pod.containers[1].name, "sidecar");
        assert_eq!(template.metadata.as_ref().unwrap().labels.as_ref().unwrap()["team"], "payments");
    }

    #[test]
    fn template_security_merges_field_by_field_with_the_restricted_defaults() {
        let c = consumer(&format!(
            "{BASE}template:\n  spec:\n    securityContext: {{runAsUser: 1000}}\n    containers:\n    \
             - {{name: worker, securityContext: {{runAsUser: 1000, readOnlyRootFilesystem: false, capabilities: {{add: [NET_BIND_SERVICE]}}}}}}\n"
        ));
        let d = deployment(&c, 1, "leasehold/worker:1", "abc", 10);
        let pod = d.spec.unwrap().template.spec.unwrap();
        let pod_security = pod.security_context.unwrap();
        assert_eq!((pod_security.run_as_user, pod_security.run_as_non_root), (Some(1000), Some(true)));
        assert_eq!(pod_security.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let security = pod.containers[0].security_context.clone().unwrap();
        assert_eq!(security.run_as_user, Some(1000), "the template's field is kept");
        assert_eq!(security.read_only_root_filesystem, Some(false), "a field the template sets wins");
        assert_eq!(security.allow_privilege_escalation, Some(false), "a field it leaves out keeps the default");
        assert_eq!(security.run_as_non_root, Some(true));
        let capabilities = security.capabilities.unwrap();
        assert_eq!(capabilities.add, Some(vec!["NET_BIND_SERVICE".to_string()]));
        assert_eq!(capabilities.drop, Some(vec!["ALL".to_string()]));
        assert_eq!(security.seccomp_profile.unwrap().type_, "RuntimeDefault");
    }

    #[test]
    fn the_handoff_secret_is_random_and_owned_by_its_consumer() {
        let c = consumer(BASE);
        let (a, b) = (new_handoff_secret(), new_handoff_secret());
        assert_ne!(a, b);
        assert_eq!(a.len(), 64, "32 bytes, hex");
        let secret = handoff_secret(&c, a.clone());
        assert_eq!(secret.metadata.name.as_deref(), Some("orders-handoff"));
        assert_eq!(secret.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
        assert_eq!(secret.string_data.unwrap()[HANDOFF_SECRET_KEY], a);
    }

    #[test]
    fn a_spec_change_changes_the_hash() {
        let a = worker_config(&consumer(BASE).spec).unwrap();
        let b = worker_config(&consumer(&format!("{BASE}concurrency: 4\n")).spec).unwrap();
        assert_ne!(config_hash(&a), config_hash(&b));
        assert_eq!(config_hash(&a), config_hash(&a.clone()));
    }

    #[test]
    fn the_grace_period_follows_the_graceful_timeout() {
        assert_eq!(termination_grace_period(Duration::from_secs(5)), 10, "the default 5 s timeout");
        assert_eq!(termination_grace_period(Duration::from_millis(2500)), 8, "rounded up to whole seconds");
        assert_eq!(termination_grace_period(Duration::from_secs(60)), 65);
        let grace = |yaml: &str| {
            let c = consumer(yaml);
            let resolved = c.spec.validate().expect("valid");
            let d = desired(&c, 1, &resolved, "leasehold/worker:1").expect("built").deployment;
            d.spec.unwrap().template.spec.unwrap().termination_grace_period_seconds
        };
        assert_eq!(grace(BASE), Some(10));
        assert_eq!(grace(&format!("{BASE}lease: {{gracefulTimeout: 40s}}\n")), Some(45));
        assert_eq!(
            grace(&format!("{BASE}template: {{spec: {{terminationGracePeriodSeconds: 120}}}}\n")),
            Some(120),
            "the template's own value wins"
        );
    }
}
