//! Keeping this process's CA in the `caBundle` of the operator's MutatingWebhookConfiguration.
//!
//! Each replica has its own CA, so the bundle holds several: a replica adds its CA (and, ahead
//! of a CA change, its successor), removes the CAs it retired, and drops any expired one. It
//! never removes another live replica's CA. A replica that dies leaves its CA behind until it
//! expires, so the bundle keeps at most [`MAX_BUNDLE_CERTIFICATES`], dropping the oldest
//! foreign ones first; a crash-looping replica cannot grow the object without bound.
//!
//! Writes are compare-and-swap: a JSON patch that first tests the configuration's
//! `resourceVersion`, so two replicas updating the bundle at once cannot lose each other's CA;
//! the loser reads again and retries. The configuration is watched, so a bundle reset by
//! someone else (a re-applied manifest) is repaired at once.

use std::{fmt, sync::Mutex};

use jiff::Timestamp;
use k8s_openapi::{ByteString, api::admissionregistration::v1::MutatingWebhookConfiguration};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use rustls::pki_types::{CertificateDer, pem::PemObject};
use serde_json::json;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The most CA certificates one `caBundle` keeps.
pub const MAX_BUNDLE_CERTIFICATES: usize = 16;

/// How often a write that lost a race is retried before the next watch event tries again.
const WRITE_ATTEMPTS: usize = 5;

/// Why the bundle could not be written.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("reading MutatingWebhookConfiguration {name}: {source}")]
    Read { name: String, source: kube::Error },
    #[error("MutatingWebhookConfiguration {name} does not exist; install config/ first")]
    Missing { name: String },
    #[error("MutatingWebhookConfiguration {name} has no webhooks to trust the operator's CA")]
    NoWebhooks { name: String },
    /// `trusted`: whether every webhook trusted this process's serving CA as last read.
    #[error("patching the caBundle of MutatingWebhookConfiguration {name}: {source}")]
    Write {
        name: String,
        source: kube::Error,
        trusted: bool,
    },
    #[error("building the caBundle patch: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("MutatingWebhookConfiguration {name} kept changing under {WRITE_ATTEMPTS} writes")]
    Contended { name: String, trusted: bool },
}

impl BundleError {
    /// Whether the API server, as far as this failed publication read the configuration,
    /// trusts the CA of this process's serving certificate in every webhook (a successor not
    /// published yet serves nothing); `None` when it could not read it.
    pub fn trusted(&self) -> Option<bool> {
        match self {
            Self::Missing { .. } | Self::NoWebhooks { .. } => Some(false),
            Self::Write { trusted, .. } | Self::Contended { trusted, .. } => Some(*trusted),
            Self::Read { .. } | Self::Encode(_) => None,
        }
    }
}

/// The CAs this process wants trusted, and the ones it no longer uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustSet {
    /// The CA that issues the serving certificate first, then its successor if any.
    pub trust: Vec<CertificateDer<'static>>,
    pub retire: Vec<CertificateDer<'static>>,
}

impl TrustSet {
    /// Whether `bundle` trusts the CA of the serving certificate: what the API server needs to
    /// call this process now.
    fn serving_trusted_by(&self, bundle: &[u8]) -> bool {
        self.trust.first().is_none_or(|serving| {
            CertificateDer::pem_slice_iter(bundle)
                .filter_map(Result::ok)
                .any(|present| present == *serving)
        })
    }
}

/// The bundle a webhook should carry, or `None` when `current` already is that bundle.
///
/// Keeps the order of the certificates already there (so replicas agree and nothing churns),
/// drops retired, expired, unreadable and duplicate ones, appends missing trusted ones, and
/// trims the oldest foreign certificates beyond [`MAX_BUNDLE_CERTIFICATES`].
pub fn merged_bundle(current: &[u8], trust: &TrustSet, now: Timestamp) -> Option<Vec<u8>> {
    let present: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(current)
        .filter_map(Result::ok)
        .collect();
    let mut kept: Vec<CertificateDer<'static>> = Vec::new();
    for certificate in &present {
        let keep = !trust.retire.contains(certificate)
            && !kept.contains(certificate)
            && validity(certificate).is_some_and(|(_, not_after)| not_after > now.as_second());
        if keep {
            kept.push(certificate.clone());
        }
    }
    for certificate in &trust.trust {
        if !kept.contains(certificate) {
            kept.push(certificate.clone());
        }
    }
    while kept.len() > MAX_BUNDLE_CERTIFICATES {
        let oldest_foreign = kept
            .iter()
            .enumerate()
            .filter(|(_, certificate)| !trust.trust.contains(certificate))
            .min_by_key(|(_, certificate)| validity(certificate).map_or(i64::MIN, |(nb, _)| nb))
            .map(|(index, _)| index);
        match oldest_foreign {
            Some(index) => kept.remove(index),
            None => break,
        };
    }
    let canonical = |certificates: &[CertificateDer<'_>]| -> Vec<u8> {
        certificates
            .iter()
            .flat_map(|c| pem(c).into_bytes())
            .collect()
    };
    let merged = canonical(&kept);
    (merged != current).then_some(merged)
}

/// Whether every certificate of `trust.trust` is in `bundle`.
pub fn trusts(bundle: &[u8], trust: &TrustSet) -> bool {
    let present: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(bundle)
        .filter_map(Result::ok)
        .collect();
    trust
        .trust
        .iter()
        .all(|certificate| present.contains(certificate))
}

/// `(not_before, not_after)` in Unix seconds, or `None` for a certificate that cannot be read.
fn validity(certificate: &CertificateDer<'_>) -> Option<(i64, i64)> {
    let (_, parsed) = X509Certificate::from_der(certificate.as_ref()).ok()?;
    let validity = parsed.validity();
    Some((
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    ))
}

fn pem(certificate: &CertificateDer<'_>) -> String {
    use std::fmt::Write as _;
    let encoded = base64_encode(certificate.as_ref());
    let mut text = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in encoded.as_bytes().chunks(64) {
        // Base64 output is ASCII, so every chunk is valid UTF-8.
        let _ = writeln!(text, "{}", String::from_utf8_lossy(line));
    }
    text.push_str("-----END CERTIFICATE-----\n");
    text
}

fn base64_encode(bytes: &[u8]) -> String {
    // k8s-openapi's ByteString serialises as standard base64 with padding, the encoding PEM uses.
    serde_json::to_value(ByteString(bytes.to_vec()))
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Writes the trust set into the webhook configuration.
pub struct Publisher {
    api: Api<MutatingWebhookConfiguration>,
    name: String,
    trust: Mutex<TrustSet>,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// What a publication found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// The bundle already trusted this process's CAs.
    Unchanged,
    /// The bundle was rewritten.
    Updated,
}

impl Publisher {
    pub fn new(api: Api<MutatingWebhookConfiguration>, name: String, trust: TrustSet) -> Self {
        Self {
            api,
            name,
            trust: Mutex::new(trust),
        }
    }

    /// The configuration's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The API of webhook configurations this publisher writes through.
    pub fn api(&self) -> &Api<MutatingWebhookConfiguration> {
        &self.api
    }

    /// Changes what this process wants trusted; call [`Publisher::publish`] next.
    pub fn set_trust(&self, trust: TrustSet) {
        *crate::sync::lock(&self.trust) = trust;
    }

    fn trust(&self) -> TrustSet {
        crate::sync::lock(&self.trust).clone()
    }

    /// Makes every webhook of the configuration trust this process's CAs.
    pub async fn publish(&self, now: Timestamp) -> Result<Published, BundleError> {
        let trust = self.trust();
        let mut trusted = false;
        for _ in 0..WRITE_ATTEMPTS {
            let config = self
                .api
                .get_opt(&self.name)
                .await
                .map_err(|source| BundleError::Read {
                    name: self.name.clone(),
                    source,
                })?
                .ok_or_else(|| BundleError::Missing {
                    name: self.name.clone(),
                })?;
            let webhooks = config.webhooks.as_deref().unwrap_or_default();
            if webhooks.is_empty() {
                return Err(BundleError::NoWebhooks {
                    name: self.name.clone(),
                });
            }
            let mut operations = vec![json!({
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": config.metadata.resource_version,
            })];
            trusted = true;
            for (index, webhook) in webhooks.iter().enumerate() {
                let current = webhook
                    .client_config
                    .ca_bundle
                    .as_ref()
                    .map_or(&[][..], |bundle| bundle.0.as_slice());
                trusted &= trust.serving_trusted_by(current);
                if let Some(merged) = merged_bundle(current, &trust, now) {
                    // `add` replaces an existing member, and creates a missing one.
                    operations.push(json!({
                        "op": "add",
                        "path": format!("/webhooks/{index}/clientConfig/caBundle"),
                        "value": ByteString(merged),
                    }));
                }
            }
            if operations.len() == 1 {
                return Ok(Published::Unchanged);
            }
            let patch: json_patch::Patch =
                serde_json::from_value(serde_json::Value::Array(operations))?;
            match self
                .api
                .patch(
                    &self.name,
                    &PatchParams::default(),
                    &Patch::Json::<()>(patch),
                )
                .await
            {
                Ok(_) => return Ok(Published::Updated),
                // 422: the `test` failed, someone wrote in between; 409: the same, seen by
                // the storage layer. Read again and retry.
                Err(kube::Error::Api(status)) if status.code == 422 || status.code == 409 => {}
                Err(source) => {
                    return Err(BundleError::Write {
                        name: self.name.clone(),
                        source,
                        trusted,
                    });
                }
            }
        }
        Err(BundleError::Contended {
            name: self.name.clone(),
            trusted,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::webhook::certs::CertificateAuthority;

    const DAY: Duration = Duration::from_hours(24);

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn ca(now: Timestamp, validity: Duration) -> CertificateDer<'static> {
        CertificateAuthority::generate("test CA", now, validity)
            .unwrap()
            .certificate()
            .clone()
    }

    fn bundle(certificates: &[&CertificateDer<'_>]) -> Vec<u8> {
        certificates
            .iter()
            .flat_map(|c| pem(c).into_bytes())
            .collect()
    }

    fn read(bundle: &[u8]) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(bundle)
            .map(Result::unwrap)
            .collect()
    }

    fn trust(trust: &[&CertificateDer<'static>]) -> TrustSet {
        TrustSet {
            trust: trust.iter().map(|c| (*c).clone()).collect(),
            retire: vec![],
        }
    }

    #[test]
    fn an_empty_bundle_gets_our_ca() {
        let now = at("2026-01-01T00:00:00Z");
        let ours = ca(now, 30 * DAY);
        let merged = merged_bundle(b"", &trust(&[&ours]), now).unwrap();
        assert_eq!(read(&merged), std::slice::from_ref(&ours));
        assert!(trusts(&merged, &trust(&[&ours])));
    }

    #[test]
    fn another_replicas_ca_is_kept_and_ours_appended() {
        let now = at("2026-01-01T00:00:00Z");
        let theirs = ca(now, 30 * DAY);
        let ours = ca(now, 30 * DAY);
        let merged = merged_bundle(&bundle(&[&theirs]), &trust(&[&ours]), now).unwrap();
        assert_eq!(read(&merged), [theirs, ours]);
    }

    #[test]
    fn a_bundle_that_already_trusts_us_is_left_alone() {
        let now = at("2026-01-01T00:00:00Z");
        let theirs = ca(now, 30 * DAY);
        let ours = ca(now, 30 * DAY);
        let current = bundle(&[&ours, &theirs]);
        assert_eq!(merged_bundle(&current, &trust(&[&ours]), now), None);
    }

    #[test]
    fn expired_retired_duplicate_and_garbage_entries_are_dropped() {
        let then = at("2025-01-01T00:00:00Z");
        let now = at("2026-01-01T00:00:00Z");
        let expired = ca(then, 30 * DAY);
        let retired = ca(now, 30 * DAY);
        let theirs = ca(now, 30 * DAY);
        let ours = ca(now, 30 * DAY);
        let mut current = bundle(&[&expired, &retired, &theirs, &theirs]);
        current.extend_from_slice(b"not a certificate\n");
        let set = TrustSet {
            trust: vec![ours.clone()],
            retire: vec![retired],
        };
        let merged = merged_bundle(&current, &set, now).unwrap();
        assert_eq!(read(&merged), [theirs, ours]);
    }

    #[test]
    fn a_successor_ca_is_trusted_alongside_the_current_one() {
        let now = at("2026-01-01T00:00:00Z");
        let current_ca = ca(now, 30 * DAY);
        let successor = ca(now, 30 * DAY);
        let merged = merged_bundle(
            &bundle(&[&current_ca]),
            &trust(&[&current_ca, &successor]),
            now,
        )
        .unwrap();
        assert_eq!(read(&merged), [current_ca.clone(), successor.clone()]);
        // At the switch, the old CA is retired and only the successor stays ours.
        let set = TrustSet {
            trust: vec![successor.clone()],
            retire: vec![current_ca],
        };
        assert_eq!(
            read(&merged_bundle(&merged, &set, now).unwrap()),
            [successor]
        );
    }

    #[test]
    fn the_bundle_is_bounded_by_dropping_the_oldest_foreign_cas() {
        let start = at("2026-01-01T00:00:00Z");
        let foreign: Vec<_> = (0..i64::try_from(MAX_BUNDLE_CERTIFICATES).unwrap())
            .map(|day| ca(start + jiff::SignedDuration::from_hours(24 * day), 60 * DAY))
            .collect();
        let now = at("2026-02-01T00:00:00Z");
        let ours = ca(now, 30 * DAY);
        let current = bundle(&foreign.iter().collect::<Vec<_>>());
        let merged = read(&merged_bundle(&current, &trust(&[&ours]), now).unwrap());
        assert_eq!(merged.len(), MAX_BUNDLE_CERTIFICATES);
        assert!(
            !merged.contains(&foreign[0]),
            "the oldest foreign CA goes first"
        );
        assert!(merged.contains(&foreign[1]));
        assert!(merged.contains(&ours));
    }

    #[test]
    fn pem_output_reads_back_identically() {
        let now = at("2026-01-01T00:00:00Z");
        let ours = ca(now, 30 * DAY);
        let text = pem(&ours);
        assert!(text.starts_with("-----BEGIN CERTIFICATE-----\n"));
        assert!(text.lines().all(|line| line.len() <= 64));
        assert_eq!(read(text.as_bytes()), [ours]);
    }
}
