//! Stage 5, apply: the built ConfigMap and Deployment (and, when asked, the workers' NetworkPolicy) by
//! server-side apply under [`FIELD_MANAGER`].

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use leasehold_crds::StreamConsumer;

use super::build::{Desired, handoff_secret, handoff_secret_name, new_handoff_secret};
use super::network_policy::network_policy;
use crate::FIELD_MANAGER;
use crate::context::Context;
use crate::error::{Error, Result};

/// Applies `desired`; returns the ready replicas the Deployment reports. A change of replicas is
/// announced by an Event, with `why` when lag scaling made it.
pub async fn apply(consumer: &StreamConsumer, ctx: &Context, desired: &Desired, why: Option<&str>) -> Result<i32> {
    let namespace = consumer.namespace().ok_or(Error::MissingMeta)?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let name = desired.name();
    let failed = |kind: &'static str| move |source| Error::Apply { object: format!("{kind}/{name}"), source };
    ensure_handoff_secret(consumer, ctx, &namespace).await?;
    if let Some(scrapers) = &ctx.settings.worker_network_policy {
        Api::<NetworkPolicy>::namespaced(ctx.client.clone(), &namespace)
            .patch(name, &params, &Patch::Apply(&network_policy(consumer, scrapers)))
            .await
            .map_err(failed("NetworkPolicy"))?;
    }
    Api::<ConfigMap>::namespaced(ctx.client.clone(), &namespace)
        .patch(name, &params, &Patch::Apply(&desired.config_map))
        .await
        .map_err(failed("ConfigMap"))?;
    let applied = Api::<Deployment>::namespaced(ctx.client.clone(), &namespace)
        .patch(name, &params, &Patch::Apply(&desired.deployment))
        .await
        .map_err(failed("Deployment"))?;
    let before = consumer.status.as_ref().and_then(|s| s.replicas);
    if let Some(before) = before
        && before != desired.replicas
    {
        let note = match why {
            Some(why) => format!("workers scaled from {before} to {}: {why}", desired.replicas),
            None => format!("workers scaled from {before} to {}", desired.replicas),
        };
        let action = format!("Scale{before}To{}", desired.replicas);
        ctx.publish_action(consumer, EventType::Normal, "Scaled", &action, note).await;
    }
    Ok(applied.status.and_then(|s| s.ready_replicas).unwrap_or(0))
}

/// Creates the consumer's handoff secret unless it exists: made once, random, and never overwritten
/// (the running workers sign with it; a new one would refuse their notices until they all restart).
async fn ensure_handoff_secret(consumer: &StreamConsumer, ctx: &Context, namespace: &str) -> Result<()> {
    let name = handoff_secret_name(consumer);
    let failed = |source| Error::Apply { object: format!("Secret/{name}"), source };
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), namespace);
    if secrets.get_metadata_opt(&name).await.map_err(failed)?.is_some() {
        return Ok(());
    }
    match secrets.create(&PostParams::default(), &handoff_secret(consumer, new_handoff_secret())).await {
        Ok(_) => {
            tracing::info!(secret = name, "handoff secret created");
            Ok(())
        }
        // Another reconcile made it first: theirs stands.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(failed(e)),
    }
}
