//! Which consumer the command is about: a StreamConsumer (`namespace/name`, read through Kubernetes) or
//! a bare lease table (`--table`) with AWS settings; and the clients to reach it.

use std::time::Duration;

use clap::Args;
use kube::Api;
use leasehold_crds::{AwsSpec, StreamConsumer, StreamConsumerSpec};
use leasehold_worker::aws::{dynamodb_client, kinesis_client, sdk_config};
use leasehold_worker::lease::{DynamoLeaseStore, LeaseSettings};

use crate::shared::error::{CliError, Result};

/// Where the consumer lives, as given on the command line.
#[derive(Args, Debug, Clone)]
pub struct TargetArgs {
    /// The consumer: `namespace/name` of a StreamConsumer (its table, region and endpoints are read from
    /// the spec). Leave it out and give `--table` to work on a lease table without Kubernetes.
    #[arg(value_name = "CONSUMER")]
    pub consumer: Option<String>,
    /// The lease table, without Kubernetes (with `--region` and the endpoints, or the AWS environment).
    #[arg(long, value_name = "TABLE", global = true)]
    pub table: Option<String>,
    /// Streams the consumer reads (with `--table`; default: every stream named in the table's rows).
    #[arg(long = "stream", value_name = "STREAM", global = true)]
    pub stream: Vec<String>,
    /// AWS region (default: a StreamConsumer's, else the environment, as the worker does).
    #[arg(long, global = true)]
    pub region: Option<String>,
    /// Kinesis endpoint URL (emulators, VPC endpoints); overrides a StreamConsumer's.
    #[arg(long, env = "LEASEHOLD_KINESIS_ENDPOINT", global = true)]
    pub kinesis_endpoint: Option<String>,
    /// DynamoDB endpoint URL (emulators, VPC endpoints); overrides a StreamConsumer's.
    #[arg(long, env = "LEASEHOLD_DYNAMODB_ENDPOINT", global = true)]
    pub dynamodb_endpoint: Option<String>,
    /// Lease duration of the group (with `--table`; a StreamConsumer's spec says it otherwise).
    #[arg(long, value_parser = humantime::parse_duration, global = true)]
    pub lease_duration: Option<Duration>,
}

/// Refuses a command that needs Kubernetes when the consumer was given as `--table`.
pub fn needs_resource(target: &Target, what: &str) -> Result<(String, String)> {
    target
        .resource
        .clone()
        .ok_or_else(|| CliError::Usage(format!("{what} needs a StreamConsumer (namespace/name), not a bare --table")))
}

/// A resolved consumer: its table, streams and clients.
pub struct Target {
    /// `namespace/name` when the consumer is a StreamConsumer.
    pub resource: Option<(String, String)>,
    /// The StreamConsumer's spec, when there is one.
    pub spec: Option<StreamConsumerSpec>,
    /// The lease table.
    pub table: String,
    /// Streams named by the spec or `--stream` (empty: whatever the table's rows name).
    pub streams: Vec<String>,
    /// The group's lease duration.
    pub lease_duration: Duration,
    /// AWS settings in force.
    pub aws: AwsSpec,
    /// DynamoDB client.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// Kinesis client.
    pub kinesis: aws_sdk_kinesis::Client,
}

impl Target {
    /// A lease store over the table that writes as `owner` (the CLI never holds leases; the id only
    /// names it in handoff requests).
    pub fn store(&self, owner: &str) -> DynamoLeaseStore {
        DynamoLeaseStore::new(
            self.dynamodb.clone(),
            self.table.clone(),
            LeaseSettings::new(owner).with_duration(self.lease_duration),
        )
    }

    /// How the consumer is named in messages.
    pub fn name(&self) -> String {
        match &self.resource {
            Some((ns, name)) => format!("{ns}/{name} (table {})", self.table),
            None => format!("table {}", self.table),
        }
    }
}

/// A Kubernetes client from the usual places (`$KUBECONFIG`, `~/.kube/config`, in-cluster), as the
/// operator makes it.
pub async fn kube_client() -> Result<kube::Client> {
    kube::Client::try_default()
        .await
        .map_err(|e| CliError::Service(format!("cannot reach the Kubernetes API: {e} (set KUBECONFIG?)")))
}

/// Splits `namespace/name`.
pub fn parse_resource(text: &str) -> Result<(String, String)> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(CliError::Usage(format!("consumer {text:?} is not namespace/name (or give --table TABLE)"))),
    }
}

/// Reads the StreamConsumer `namespace/name`.
pub async fn get_consumer(client: &kube::Client, ns: &str, name: &str) -> Result<StreamConsumer> {
    let api: Api<StreamConsumer> = Api::namespaced(client.clone(), ns);
    match api.get_opt(name).await? {
        Some(consumer) => Ok(consumer),
        None => Err(CliError::NotFound(format!("no StreamConsumer {name} in namespace {ns}"))),
    }
}

/// Resolves the consumer named by `args`.
pub async fn resolve(args: &TargetArgs) -> Result<Target> {
    let (resource, spec) = match (&args.consumer, &args.table) {
        (Some(_), Some(_)) => {
            return Err(CliError::Usage("give CONSUMER (namespace/name) or --table, not both".into()));
        }
        (None, None) => {
            return Err(CliError::Usage("name the consumer: namespace/name of a StreamConsumer, or --table".into()));
        }
        (Some(text), None) => {
            let (ns, name) = parse_resource(text)?;
            let consumer = get_consumer(&kube_client().await?, &ns, &name).await?;
            (Some((ns, name)), Some(consumer.spec))
        }
        (None, Some(_)) => (None, None),
    };
    let mut aws = spec.as_ref().map(|s| s.aws.clone()).unwrap_or_default();
    // Flags (and their environment variables) win over the spec: the same services reached from
    // outside the cluster (a VPC endpoint's public name, a port-forward).
    if args.region.is_some() {
        aws.region = args.region.clone();
    }
    if args.kinesis_endpoint.is_some() {
        aws.kinesis_endpoint = args.kinesis_endpoint.clone();
    }
    if args.dynamodb_endpoint.is_some() {
        aws.dynamodb_endpoint = args.dynamodb_endpoint.clone();
    }
    let table = match (&args.table, &spec) {
        (Some(table), _) => table.clone(),
        (None, Some(spec)) => match &spec.lease_table {
            Some(table) => table.name.clone(),
            None => {
                let (ns, name) = resource.clone().unwrap_or_default();
                return Err(CliError::NotFound(format!(
                    "StreamConsumer {ns}/{name} has no spec.leaseTable: its workers keep leases in memory, there is no table to work on"
                )));
            }
        },
        (None, None) => unreachable_usage()?,
    };
    let streams = match &spec {
        Some(spec) => spec.streams.iter().map(|s| s.stream_name().to_string()).collect(),
        None => args.stream.clone(),
    };
    let lease_duration = args.lease_duration.unwrap_or_else(|| {
        spec.as_ref()
            .and_then(|s| s.validate().ok())
            .map(|r| r.durations.lease)
            .unwrap_or(leasehold_crds::defaults::LEASE_DURATION)
    });
    let sdk = sdk_config(&aws).await;
    let (dynamodb, kinesis) = (dynamodb_client(&sdk, &aws), kinesis_client(&sdk, &aws));
    Ok(Target { resource, spec, table, streams, lease_duration, aws, dynamodb, kinesis })
}

fn unreachable_usage() -> Result<String> {
    Err(CliError::Usage("name the consumer: namespace/name of a StreamConsumer, or --table".into()))
}

/// Posts a Normal event `reason` on the consumer's StreamConsumer, when it is one and the cluster
/// answers (a warning on stderr otherwise: what the command did stands either way).
pub async fn post_event(target: &Target, reason: &str, action: &str, note: String) {
    use kube::Resource;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let Some((ns, name)) = &target.resource else { return };
    let posted = async {
        let client = kube_client().await?;
        let consumer = get_consumer(&client, ns, name).await?;
        let reporter = Reporter { controller: "leasehold-cli".into(), instance: None };
        let event = Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        Recorder::new(client, reporter)
            .publish(&event, &consumer.object_ref(&()))
            .await
            .map_err(|e| CliError::Service(format!("kubernetes: {e}")))
    };
    if let Err(e) = posted.await {
        eprintln!("warning: no {reason} event posted on {ns}/{name}: {e}");
    }
}
