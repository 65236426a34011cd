//! Stage 1, validate: the rules the worker checks (`StreamConsumerSpec::validate`, shared with it). The
//! API server refuses almost every such spec already (CRD schema and CEL rules); what only this check
//! sees (a date that does not exist, say) stops the pipeline here. With restricted templates on
//! (`--restrict-templates`, the chart's `restrictTemplates`), a pod template asking for the host's
//! network, processes or files, or for a privileged container, stops it too.

use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};
use leasehold_crds::{ResolvedSpec, StreamConsumer};

use crate::error::{Error, Result};

/// The spec with its defaults applied, or every rule it breaks; with `restrict_templates`, also every
/// host access or privilege its pod template asks for.
pub fn validate(consumer: &StreamConsumer, restrict_templates: bool) -> Result<ResolvedSpec> {
    let resolved = consumer.spec.validate().map_err(Error::InvalidSpec)?;
    if restrict_templates {
        let refused = consumer.spec.template.as_ref().map(template_refusals).unwrap_or_default();
        if !refused.is_empty() {
            return Err(Error::TemplateRefused(refused));
        }
    }
    Ok(resolved)
}

/// What a pod template asks for that restricted templates refuse: `hostNetwork`, `hostPID`, `hostIPC`,
/// `hostPath` volumes, privileged containers (init and ephemeral ones too), each named by its field.
pub fn template_refusals(template: &PodTemplateSpec) -> Vec<String> {
    let Some(pod) = template.spec.as_ref() else { return Vec::new() };
    let mut refused = Vec::new();
    for (field, on) in [("hostNetwork", pod.host_network), ("hostPID", pod.host_pid), ("hostIPC", pod.host_ipc)] {
        if on == Some(true) {
            refused.push(format!("spec.template.spec.{field}: true"));
        }
    }
    for volume in pod.volumes.iter().flatten().filter(|v| v.host_path.is_some()) {
        refused.push(format!("spec.template.spec.volumes[{}]: hostPath", volume.name));
    }
    let privileged = |c: &Container| c.security_context.as_ref().and_then(|s| s.privileged) == Some(true);
    let lists = [("containers", Some(&pod.containers)), ("initContainers", pod.init_containers.as_ref())];
    for (list, containers) in lists {
        for container in containers.into_iter().flatten().filter(|c| privileged(c)) {
            refused.push(format!("spec.template.spec.{list}[{}].securityContext.privileged: true", container.name));
        }
    }
    for container in pod.ephemeral_containers.iter().flatten() {
        if container.security_context.as_ref().and_then(|s| s.privileged) == Some(true) {
            refused.push(format!(
                "spec.template.spec.ephemeralContainers[{}].securityContext.privileged: true",
                container.name
            ));
        }
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(yaml: &str) -> PodTemplateSpec {
        serde_yaml_ng::from_str(yaml).expect("template")
    }

    fn consumer(template_yaml: &str) -> StreamConsumer {
        let mut consumer: StreamConsumer = serde_yaml_ng::from_str(
            "apiVersion: leasehold.io/v1alpha1\nkind: StreamConsumer\nmetadata: {name: orders, namespace: shop}\nspec:\n  streams: [{name: orders}]\n  processor: {stdout: {}}\n",
        )
        .expect("consumer");
        consumer.spec.template = Some(template(template_yaml));
        consumer
    }

    #[test]
    fn restricted_templates_refuse_each_host_access_and_privilege() {
        let cases = [
            ("spec: {hostNetwork: true, containers: []}", "spec.template.spec.hostNetwork: true"),
            ("spec: {hostPID: true, containers: []}", "spec.template.spec.hostPID: true"),
            ("spec: {hostIPC: true, containers: []}", "spec.template.spec.hostIPC: true"),
            (
                "spec: {containers: [], volumes: [{name: root, hostPath: {path: /}}]}",
                "spec.template.spec.volumes[root]: hostPath",
            ),
            (
                "spec: {containers: [{name: sidecar, securityContext: {privileged: true}}]}",
                "spec.template.spec.containers[sidecar].securityContext.privileged: true",
            ),
            (
                "spec: {containers: [], initContainers: [{name: setup, securityContext: {privileged: true}}]}",
                "spec.template.spec.initContainers[setup].securityContext.privileged: true",
            ),
        ];
        for (yaml, expected) in cases {
            let consumer = consumer(yaml);
            match validate(&consumer, true) {
                Err(Error::TemplateRefused(refused)) => assert_eq!(refused, vec![expected.to_string()], "{yaml}"),
                other => panic!("{yaml}: expected TemplateRefused, got {other:?}"),
            }
            // Off by default: the same template passes without the restriction.
            assert!(validate(&consumer, false).is_ok(), "{yaml}");
        }
    }

    #[test]
    fn an_ordinary_template_passes_restricted_and_every_refusal_is_named() {
        let ordinary = consumer(
            "spec: {containers: [{name: app, image: app:1, securityContext: {privileged: false}}], volumes: [{name: tmp, emptyDir: {}}]}",
        );
        assert!(validate(&ordinary, true).is_ok());
        let all = template(
            "spec: {hostNetwork: true, hostPID: true, containers: [{name: a, securityContext: {privileged: true}}], volumes: [{name: h, hostPath: {path: /var}}]}",
        );
        assert_eq!(template_refusals(&all).len(), 4);
    }
}
