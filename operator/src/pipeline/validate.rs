//! Stage 1, validate: the rules the worker checks (`StreamConsumerSpec::validate`, shared with it). The
//! API server refuses almost every such spec already (CRD schema and CEL rules); what only this check
//! sees (a date that does not exist, say) stops the pipeline here.

use leasehold_crds::{ResolvedDurations, StreamConsumer};

use crate::error::{Error, Result};

/// The spec's durations, or every rule it breaks.
pub fn validate(consumer: &StreamConsumer) -> Result<ResolvedDurations> {
    consumer.spec.validate().map_err(Error::InvalidSpec)
}
