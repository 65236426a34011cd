//! The worker pods' NetworkPolicy (pure, like [`super::build`]): the handoff port open to the pods of
//! the same consumer only, the metrics port to the scraper the operator was told of (or to anyone), and
//! egress left alone. Made when the operator runs with `--worker-network-policy` (the chart's
//! `workerNetworkPolicy.enabled`).

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use leasehold_crds::StreamConsumer;

use super::build::{worker_labels, workers_name};
pub use crate::context::MetricsScrapers;

/// Who may scrape the metrics port, as NetworkPolicy peers (`None`: anyone).
fn peers(scrapers: &MetricsScrapers) -> Option<Vec<NetworkPolicyPeer>> {
    let selector = |labels: &BTreeMap<String, String>| {
        (!labels.is_empty()).then(|| LabelSelector { match_labels: Some(labels.clone()), ..LabelSelector::default() })
    };
    let peer = NetworkPolicyPeer {
        namespace_selector: selector(&scrapers.namespace_labels),
        pod_selector: selector(&scrapers.pod_labels),
        ..NetworkPolicyPeer::default()
    };
    (peer.namespace_selector.is_some() || peer.pod_selector.is_some()).then(|| vec![peer])
}

/// The labels every pod of `consumer` carries and no other consumer's does.
fn consumer_pods(consumer: &StreamConsumer) -> LabelSelector {
    LabelSelector { match_labels: Some(worker_labels(consumer)), ..LabelSelector::default() }
}

fn tcp(port: &str) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::String(port.into())),
        protocol: Some("TCP".into()),
        ..NetworkPolicyPort::default()
    }
}

/// The NetworkPolicy of `consumer`'s worker pods, owned by the consumer like its Deployment.
pub fn network_policy(consumer: &StreamConsumer, scrapers: &MetricsScrapers) -> NetworkPolicy {
    let mut metadata = super::build::owned_meta(consumer);
    metadata.name = Some(workers_name(consumer));
    NetworkPolicy {
        metadata,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(consumer_pods(consumer)),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![
                // Handoff notices come from the consumer's own workers only (same namespace).
                NetworkPolicyIngressRule {
                    from: Some(vec![NetworkPolicyPeer {
                        pod_selector: Some(consumer_pods(consumer)),
                        ..NetworkPolicyPeer::default()
                    }]),
                    ports: Some(vec![tcp("handoff")]),
                },
                NetworkPolicyIngressRule { from: peers(scrapers), ports: Some(vec![tcp("metrics")]) },
            ]),
            ..NetworkPolicySpec::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumer() -> StreamConsumer {
        let mut consumer: StreamConsumer = serde_yaml_ng::from_str(
            "apiVersion: leasehold.io/v1alpha1\nkind: StreamConsumer\nmetadata: {name: orders, namespace: shop, uid: uid-1}\nspec:\n  streams: [{name: orders}]\n  processor: {stdout: {}}\n",
        )
        .expect("consumer");
        consumer.metadata.uid = Some("uid-1".into());
        consumer
    }

    #[test]
    fn handoff_is_open_to_the_consumers_pods_and_metrics_to_the_scraper() {
        let scrapers = MetricsScrapers::parse("kubernetes.io/metadata.name=monitoring", "app=prometheus").unwrap();
        let policy = network_policy(&consumer(), &scrapers);
        assert_eq!(policy.metadata.name.as_deref(), Some("orders-workers"));
        assert_eq!(policy.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
        let spec = policy.spec.unwrap();
        let pods = spec.pod_selector.unwrap().match_labels.unwrap();
        assert_eq!(pods["leasehold.io/consumer"], "orders");
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]), "egress is left open");
        let ingress = spec.ingress.unwrap();
        let handoff = &ingress[0];
        assert_eq!(handoff.ports.as_ref().unwrap()[0].port, Some(IntOrString::String("handoff".into())));
        let from = handoff.from.as_ref().unwrap();
        assert_eq!(from.len(), 1);
        assert!(from[0].namespace_selector.is_none(), "the consumer's own namespace only");
        assert_eq!(
            from[0].pod_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["leasehold.io/consumer"],
            "orders"
        );
        let metrics = &ingress[1];
        assert_eq!(metrics.ports.as_ref().unwrap()[0].port, Some(IntOrString::String("metrics".into())));
        let scraper = &metrics.from.as_ref().unwrap()[0];
        assert_eq!(
            scraper.namespace_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["kubernetes.io/metadata.name"],
            "monitoring"
        );
        assert_eq!(scraper.pod_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["app"], "prometheus");
    }

    #[test]
    fn without_a_scraper_metrics_stay_open_and_bad_labels_are_named() {
        let policy = network_policy(&consumer(), &MetricsScrapers::default());
        assert_eq!(policy.spec.unwrap().ingress.unwrap()[1].from, None, "no from: every source");
        assert_eq!(MetricsScrapers::parse("a=b, c=d", "").unwrap().namespace_labels.len(), 2);
        assert!(MetricsScrapers::parse("oops", "").unwrap_err().contains("oops"));
    }
}
