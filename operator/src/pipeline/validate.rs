//! Stage 1, validate: the rules the worker checks (`StreamConsumerSpec::validate`, shared with it). The
//! API server refuses almost every such spec already (CRD schema and CEL rules); what only this check
//! sees (a date that does not exist, say) stops the pipeline here.

use leasehold_crds::{ResolvedSpec, StreamConsumer};

use crate::error::{Error, Result};

/// The spec with its defaults applied, or every rule it breaks.
pub fn validate(consumer: &StreamConsumer) -> Result<ResolvedSpec> {
    consumer.spec.validate().map_err(Error::InvalidSpec)
}
