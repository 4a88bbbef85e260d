//! The webhook's certificates: a CA of this process, serving certificates it signs, and a
//! rustls resolver through which a renewed certificate replaces the old one without a restart.
//!
//! Every replica makes its own CA at start-up (no Secret to share, so no Secret to read); the
//! webhook configuration's `caBundle` trusts the CAs of all live replicas (see
//! [`super::ca_bundle`]). Renewal follows [`RotationPolicy`]: a serving certificate is replaced
//! `renew_before` its expiry, and a CA that could not sign a full-length certificate at the
//! next renewal gets a successor, published one renewal ahead of its first use so the API
//! server already trusts it when it is presented.

use std::{
    fmt,
    sync::{Arc, RwLock},
    time::Duration,
};

use jiff::{SignedDuration, Timestamp};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::{
    pki_types::{CertificateDer, PrivateKeyDer},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};

/// Certificates are valid from a little before they are made, so a client whose clock is
/// slightly behind ours accepts them.
const CLOCK_SKEW_ALLOWANCE: SignedDuration = SignedDuration::from_mins(5);

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("generating a certificate failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("the generated key is not usable by rustls: {0}")]
    Key(#[from] rustls::Error),
    #[error("certificate time out of range: {0}")]
    Time(String),
}

/// A CA of this process, which signs its serving certificates.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    der: CertificateDer<'static>,
    not_after: Timestamp,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// Makes a new CA valid from `now` for `validity`.
    pub fn generate(
        common_name: &str,
        now: Timestamp,
        validity: Duration,
    ) -> Result<Self, CertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let not_after = add(now, validity)?;
        params.not_before = offset_date_time(sub(now, CLOCK_SKEW_ALLOWANCE)?)?;
        params.not_after = offset_date_time(not_after)?;
        let certificate = params.self_signed(&key)?;
        Ok(Self {
            der: certificate.der().clone(),
            issuer: Issuer::new(params, key),
            not_after,
        })
    }

    /// The CA certificate, as the webhook configuration's `caBundle` must trust it.
    pub fn certificate(&self) -> &CertificateDer<'static> {
        &self.der
    }

    /// When the CA expires.
    pub fn not_after(&self) -> Timestamp {
        self.not_after
    }

    /// Signs a serving certificate for `names` (DNS names or IP addresses), valid from `now`
    /// for `validity` but never beyond the CA's own expiry.
    pub fn issue(
        &self,
        names: &[String],
        now: Timestamp,
        validity: Duration,
    ) -> Result<ServingCertificate, CertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name =
            distinguished_name(names.first().map_or("gpuqueue-webhook", String::as_str));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let not_after = add(now, validity)?.min(self.not_after);
        params.not_before = offset_date_time(sub(now, CLOCK_SKEW_ALLOWANCE)?)?;
        params.not_after = offset_date_time(not_after)?;
        let certificate = params.signed_by(&key, &self.issuer)?;
        let private_key = PrivateKeyDer::from(key);
        let signing_key = rustls::crypto::ring::sign::any_supported_type(&private_key)?;
        Ok(ServingCertificate {
            certified: Arc::new(CertifiedKey::new(
                vec![certificate.der().clone()],
                signing_key,
            )),
            not_after,
        })
    }
}

/// A serving certificate with its key, ready for rustls.
#[derive(Debug, Clone)]
pub struct ServingCertificate {
    pub certified: Arc<CertifiedKey>,
    pub not_after: Timestamp,
}

/// Hands rustls the current serving certificate; [`CertResolver::replace`] swaps it for every
/// handshake that follows, while connections already open keep theirs.
#[derive(Debug)]
pub struct CertResolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertResolver {
    pub fn new(certificate: &ServingCertificate) -> Self {
        Self {
            current: RwLock::new(certificate.certified.clone()),
        }
    }

    pub fn replace(&self, certificate: &ServingCertificate) {
        *crate::sync::write(&self.current) = certificate.certified.clone();
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(crate::sync::read(&self.current).clone())
    }
}

/// When certificates are renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationPolicy {
    pub cert_validity: Duration,
    pub renew_before: Duration,
    pub ca_validity: Duration,
}

/// What happens to the CA at a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaStep {
    /// The CA in use signs the new certificate and is good for the next renewal too.
    Keep,
    /// The CA in use signs the new certificate; a successor is made and published now,
    /// because at the next renewal the CA in use could not sign a full-length certificate.
    PrepareSuccessor,
    /// The successor published at the last renewal signs the new certificate; the old CA is
    /// retired.
    SwitchToSuccessor,
    /// The CA in use cannot sign a full-length certificate now and there is no successor
    /// (the process was suspended past a renewal): make one, publish it, and switch at once.
    ReplaceNow,
}

impl RotationPolicy {
    /// Refuses a policy under which a certificate would be renewed as soon as it is made.
    pub fn validate(&self) -> Result<(), String> {
        if self.renew_before >= self.cert_validity {
            return Err(format!(
                "--webhook-cert-renew-before ({:?}) must be shorter than --webhook-cert-validity ({:?})",
                self.renew_before, self.cert_validity
            ));
        }
        if self.ca_validity < self.cert_validity.saturating_mul(2) {
            return Err(format!(
                "--webhook-ca-validity ({:?}) must be at least twice --webhook-cert-validity ({:?})",
                self.ca_validity, self.cert_validity
            ));
        }
        Ok(())
    }

    /// When a certificate expiring at `not_after` is renewed.
    pub fn renewal_time(&self, not_after: Timestamp) -> Timestamp {
        SignedDuration::try_from(self.renew_before)
            .ok()
            .and_then(|before| not_after.checked_sub(before).ok())
            .unwrap_or(Timestamp::MIN)
    }

    /// What to do with the CA at a renewal at `now`, the CA in use expiring at
    /// `ca_not_after`.
    pub fn ca_step(&self, now: Timestamp, ca_not_after: Timestamp, has_successor: bool) -> CaStep {
        if has_successor {
            return CaStep::SwitchToSuccessor;
        }
        let full_length_from =
            |at: Timestamp| add(at, self.cert_validity).unwrap_or(Timestamp::MAX);
        if ca_not_after < full_length_from(now) {
            return CaStep::ReplaceNow;
        }
        // The certificate issued now is renewed at `next_renewal`; the one issued then must
        // still be full length.
        let next_renewal = self.renewal_time(full_length_from(now));
        if ca_not_after < full_length_from(next_renewal) {
            CaStep::PrepareSuccessor
        } else {
            CaStep::Keep
        }
    }
}

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "gpuqueue");
    name.push(DnType::CommonName, common_name);
    name
}

fn add(at: Timestamp, duration: Duration) -> Result<Timestamp, CertError> {
    SignedDuration::try_from(duration)
        .ok()
        .and_then(|duration| at.checked_add(duration).ok())
        .ok_or_else(|| CertError::Time(format!("{at} + {duration:?}")))
}

fn sub(at: Timestamp, duration: SignedDuration) -> Result<Timestamp, CertError> {
    at.checked_sub(duration)
        .map_err(|error| CertError::Time(format!("{at} - {duration}: {error}")))
}

fn offset_date_time(at: Timestamp) -> Result<time::OffsetDateTime, CertError> {
    time::OffsetDateTime::from_unix_timestamp(at.as_second())
        .map_err(|error| CertError::Time(format!("{at}: {error}")))
}

#[cfg(test)]
mod tests {
    use x509_parser::prelude::*;

    use super::*;

    const HOUR: Duration = Duration::from_hours(1);

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn parse<'a>(der: &'a CertificateDer<'_>) -> X509Certificate<'a> {
        X509Certificate::from_der(der.as_ref()).unwrap().1
    }

    #[test]
    fn the_ca_is_a_ca_and_signs_a_server_certificate_for_every_name() {
        let now = at("2026-01-01T00:00:00Z");
        let ca = CertificateAuthority::generate("test CA", now, 720 * HOUR).unwrap();
        let ca_cert = parse(ca.certificate());
        assert!(ca_cert.is_ca());
        assert_eq!(ca.not_after(), at("2026-01-31T00:00:00Z"));

        let names = [
            "gpuqueue-webhook.ops.svc".to_owned(),
            "127.0.0.1".to_owned(),
        ];
        let serving = ca.issue(&names, now, 24 * HOUR).unwrap();
        assert_eq!(serving.not_after, at("2026-01-02T00:00:00Z"));
        let leaf = parse(&serving.certified.cert[0]);
        assert!(!leaf.is_ca());
        assert_eq!(leaf.issuer(), ca_cert.subject());
        let sans = leaf.subject_alternative_name().unwrap().unwrap();
        let sans = format!("{:?}", sans.value.general_names);
        assert!(sans.contains("gpuqueue-webhook.ops.svc"), "{sans}");
        assert!(
            sans.contains("127.0.0.1") || sans.contains("[127, 0, 0, 1]"),
            "{sans}"
        );
        // Valid a little before it was made, for clients whose clocks lag.
        assert!(leaf.validity().not_before.timestamp() < now.as_second());
    }

    #[test]
    fn a_serving_certificate_never_outlives_its_ca() {
        let now = at("2026-01-01T00:00:00Z");
        let ca = CertificateAuthority::generate("test CA", now, 10 * HOUR).unwrap();
        let serving = ca.issue(&["a.b.svc".to_owned()], now, 24 * HOUR).unwrap();
        assert_eq!(serving.not_after, ca.not_after());
    }

    #[test]
    fn the_resolver_hands_out_the_replacement() {
        let now = at("2026-01-01T00:00:00Z");
        let ca = CertificateAuthority::generate("test CA", now, 720 * HOUR).unwrap();
        let first = ca.issue(&["a.b.svc".to_owned()], now, 24 * HOUR).unwrap();
        let second = ca.issue(&["a.b.svc".to_owned()], now, 24 * HOUR).unwrap();
        let resolver = CertResolver::new(&first);
        let current = || resolver.current.read().unwrap().cert[0].clone();
        assert_eq!(current(), first.certified.cert[0]);
        resolver.replace(&second);
        assert_eq!(current(), second.certified.cert[0]);
    }

    fn policy() -> RotationPolicy {
        RotationPolicy {
            cert_validity: 24 * HOUR,
            renew_before: 8 * HOUR,
            ca_validity: 720 * HOUR,
        }
    }

    #[test]
    fn certificates_are_renewed_before_they_expire() {
        let expiry = at("2026-01-02T00:00:00Z");
        assert_eq!(policy().renewal_time(expiry), at("2026-01-01T16:00:00Z"));
    }

    #[test]
    fn a_young_ca_keeps_signing() {
        let now = at("2026-01-01T00:00:00Z");
        let step = policy().ca_step(now, at("2026-01-31T00:00:00Z"), false);
        assert_eq!(step, CaStep::Keep);
    }

    #[test]
    fn an_ageing_ca_gets_a_successor_one_renewal_before_it_is_used() {
        // Renewed at 16h, the certificate issued then must last until 16h + 24h = 40h.
        let now = at("2026-01-01T00:00:00Z");
        let step =
            |ca_not_after, has_successor| policy().ca_step(now, at(ca_not_after), has_successor);
        assert_eq!(
            step("2026-01-02T15:59:59Z", false),
            CaStep::PrepareSuccessor
        );
        assert_eq!(step("2026-01-02T16:00:00Z", false), CaStep::Keep);
        assert_eq!(
            step("2026-01-02T15:59:59Z", true),
            CaStep::SwitchToSuccessor
        );
    }

    #[test]
    fn a_ca_too_old_to_sign_a_full_certificate_is_replaced_at_once() {
        let now = at("2026-01-01T00:00:00Z");
        let step = policy().ca_step(now, at("2026-01-01T23:59:59Z"), false);
        assert_eq!(step, CaStep::ReplaceNow);
    }

    #[test]
    fn policies_that_would_renew_constantly_are_refused() {
        let mut bad = policy();
        bad.renew_before = 24 * HOUR;
        assert!(
            bad.validate()
                .unwrap_err()
                .contains("--webhook-cert-renew-before")
        );
        let mut bad = policy();
        bad.ca_validity = 30 * HOUR;
        assert!(
            bad.validate()
                .unwrap_err()
                .contains("--webhook-ca-validity")
        );
        policy().validate().unwrap();
    }
}
