//! The dead-letter bucket: its letter objects read (those not tagged redriven), and a redriven one
//! tagged.

use super::letter::{Copy, Verdict, take};
use super::{REDRIVEN_TAG, Run, Source};
use crate::shared::error::{CliError, Result};
use crate::shared::snapshot::now_ms;

/// Reads every letter object under `prefix` not tagged redriven.
pub(super) async fn read_bucket(run: &mut Run<'_>, bucket: &str, prefix: &str) -> Result<()> {
    let failed = |e: String| CliError::Service(format!("reading s3://{bucket}/{prefix}: {e}"));
    let mut pages = run.s3.list_objects_v2().bucket(bucket).prefix(prefix).into_paginator().send();
    let mut keys = Vec::new();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| failed(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))?;
        for object in page.contents.unwrap_or_default() {
            let written = object.last_modified.and_then(|t| t.to_millis().ok());
            if let Some(key) = object.key {
                keys.push((key, written));
            }
        }
    }
    for (key, written) in keys {
        if run.full() {
            run.count(Source::S3).read += 1;
            run.count(Source::S3).left_out += 1;
            continue;
        }
        let tags = run
            .s3
            .get_object_tagging()
            .bucket(bucket)
            .key(&key)
            .send()
            .await
            .map_err(|e| failed(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))?;
        if tags.tag_set.iter().any(|t| t.key == REDRIVEN_TAG) {
            run.count(Source::S3).read += 1;
            run.count(Source::S3).already_redriven += 1;
            continue;
        }
        let object = run
            .s3
            .get_object()
            .bucket(bucket)
            .key(&key)
            .send()
            .await
            .map_err(|e| failed(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))?;
        let body = object.body.collect().await.map_err(|e| failed(e.to_string()))?.into_bytes();
        if let Verdict::Take(pending) = run.judge(Source::S3, Copy::S3 { key }, &body, written).await? {
            take(run, pending);
        }
    }
    Ok(())
}

/// The dead-letter bucket: `--bucket`, else the spec's.
pub(super) fn bucket_name(run: &Run<'_>) -> String {
    run.args
        .bucket
        .clone()
        .or_else(|| {
            run.target
                .spec
                .as_ref()
                .and_then(|s| s.retry.as_ref())
                .and_then(|r| r.dead_letter_bucket.as_ref())
                .map(|b| b.name.clone())
        })
        .unwrap_or_default()
}

/// Adds the redriven tag to `key`, keeping its other tags.
pub(super) async fn tag_redriven(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<()> {
    let failed = |e: String| CliError::Service(format!("tagging s3://{bucket}/{key} redriven: {e}"));
    let tags = s3
        .get_object_tagging()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .map_err(|e| failed(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))?;
    let mut set: Vec<aws_sdk_s3::types::Tag> = tags.tag_set.into_iter().filter(|t| t.key != REDRIVEN_TAG).collect();
    set.push(
        aws_sdk_s3::types::Tag::builder()
            .key(REDRIVEN_TAG)
            .value(now_ms().to_string())
            .build()
            .map_err(|e| failed(e.to_string()))?,
    );
    let tagging =
        aws_sdk_s3::types::Tagging::builder().set_tag_set(Some(set)).build().map_err(|e| failed(e.to_string()))?;
    s3.put_object_tagging()
        .bucket(bucket)
        .key(key)
        .tagging(tagging)
        .send()
        .await
        .map_err(|e| failed(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))?;
    Ok(())
}
