//! Quantities: GPU amounts in milli-units, GPU resource names, and Kubernetes quantity strings.
//!
//! Quota accounting counts every GPU resource in milli-units (1000 = one device), so whole GPUs,
//! MIG instances and shared fractions of a GPU add up the same way: a guarantee of 8 GPUs is
//! 8000, a task using half a GPU holds 500.

use std::{
    fmt,
    iter::Sum,
    ops::{Add, AddAssign},
    sync::Arc,
};

/// Milli-units of one device: a whole GPU or one MIG instance.
pub const MILLI_PER_DEVICE: u32 = 1000;

/// An amount of a GPU resource in milli-units (1000 = one device).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Milli(pub u64);

impl Milli {
    /// Nothing.
    pub const ZERO: Self = Self(0);

    /// `devices` whole devices.
    pub const fn devices(devices: u64) -> Self {
        Self(devices * MILLI_PER_DEVICE as u64)
    }

    /// The difference, or zero when `other` is larger.
    #[must_use]
    pub const fn saturating_sub(self, other: Self) -> Self {
        Self(self.0.saturating_sub(other.0))
    }

    /// Whole devices, rounded up (a status field counts a half-used GPU as used).
    pub const fn devices_ceil(self) -> u64 {
        self.0.div_ceil(MILLI_PER_DEVICE as u64)
    }
}

impl Add for Milli {
    type Output = Self;
    fn add(self, other: Self) -> Self {
        Self(self.0.saturating_add(other.0))
    }
}

impl AddAssign for Milli {
    fn add_assign(&mut self, other: Self) {
        *self = *self + other;
    }
}

impl Sum for Milli {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::ZERO, Add::add)
    }
}

/// Devices, with up to three decimals when fractional: `8`, `1.5`, `0.25`.
impl fmt::Display for Milli {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per = u64::from(MILLI_PER_DEVICE);
        let (whole, frac) = (self.0 / per, self.0 % per);
        if frac == 0 {
            write!(f, "{whole}")
        } else {
            let digits = format!("{frac:03}");
            write!(f, "{whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

/// The name of a GPU resource pods request and nodes expose, such as `nvidia.com/gpu` or
/// `nvidia.com/mig-1g.10gb`. Cheap to clone.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceName(Arc<str>);

impl ResourceName {
    /// A resource name as given; [`is_gpu_resource`] tells whether the core manages it.
    pub fn new(name: &str) -> Self {
        Self(Arc::from(name))
    }

    /// `nvidia.com/gpu`: a whole NVIDIA GPU.
    pub fn nvidia_gpu() -> Self {
        Self::new(gpuqueue_api::NVIDIA_GPU)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name without its vendor prefix, for compact summaries: `gpu`, `mig-1g.10gb`.
    pub fn short(&self) -> &str {
        self.0.rsplit_once('/').map_or(&self.0, |(_, short)| short)
    }

    /// Memory of one device in MiB when the name says it, as MIG profiles do
    /// (`nvidia.com/mig-3g.40gb` is 40 GiB).
    pub fn profile_memory_mib(&self) -> Option<u64> {
        let profile = self.short().strip_prefix("mig-")?;
        let (_, memory) = profile.split_once('.')?;
        let gigabytes: String = memory
            .strip_suffix("gb")
            .or_else(|| memory.split_once("gb").map(|(gb, _)| gb))?
            .to_string();
        gigabytes.parse::<u64>().ok().map(|gb| gb * 1024)
    }
}

impl fmt::Debug for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for ResourceName {
    fn from(name: String) -> Self {
        Self::new(&name)
    }
}

impl From<&str> for ResourceName {
    fn from(name: &str) -> Self {
        Self::new(name)
    }
}

/// Whether the core manages this extended resource: whole NVIDIA GPUs (shared under
/// `nvidia.com/gpu.shared` too), NVIDIA MIG profiles and AMD GPUs. Other extended resources
/// (hugepages, NICs) are left to kube-scheduler.
pub fn is_gpu_resource(name: &str) -> bool {
    name == gpuqueue_api::NVIDIA_GPU
        || name == gpuqueue_api::NVIDIA_GPU_SHARED
        || name.starts_with("nvidia.com/mig-")
        || name == "amd.com/gpu"
}

/// The prefix of the extended-resource name every DeviceClass answers to (KEP-5004, beta and on
/// by default in 1.36): `deviceclass.resource.kubernetes.io/<class>` asks kube-scheduler for
/// that many devices of the class, allocated through a claim it creates itself.
pub const DEVICE_CLASS_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// Whether a container may ask for devices of a DeviceClass under this name: the class's
/// implicit name, or an extended resource outside the `kubernetes.io` domains (the names a
/// class's `spec.extendedResourceName` may take). Names the core counts by themselves
/// ([`is_gpu_resource`], [`is_device_part`]) are not.
pub fn may_be_device_class(name: &str) -> bool {
    if name.starts_with(DEVICE_CLASS_PREFIX) {
        return true;
    }
    let Some((domain, _)) = name.split_once('/') else {
        return false;
    };
    let native = domain == "kubernetes.io" || domain.ends_with(".kubernetes.io");
    !native && !is_gpu_resource(name) && !is_device_part(name)
}

/// Whether this resource asks for a part of each `nvidia.com/gpu` device (HAMi's memory and
/// compute): not a device of its own, but never to be ignored.
pub fn is_device_part(name: &str) -> bool {
    matches!(
        name,
        gpuqueue_api::hami::GPU_MEMORY
            | gpuqueue_api::hami::GPU_MEMORY_PERCENTAGE
            | gpuqueue_api::hami::GPU_CORES
    )
}

/// A Kubernetes quantity string that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a Kubernetes quantity ({rule})")]
pub struct QuantityError {
    pub value: String,
    pub rule: &'static str,
}

/// A non-negative Kubernetes quantity, exact: `mantissa × 10^exp10 × 2^exp2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    mantissa: u128,
    exp10: i32,
    exp2: u32,
}

impl Quantity {
    /// Parses `1`, `1.5`, `500m`, `16Gi`, `2k`, `1e3` (the Kubernetes quantity grammar, without
    /// negative numbers, which no resource amount may be).
    pub fn parse(value: &str) -> Result<Self, QuantityError> {
        let err = |rule| QuantityError {
            value: value.to_string(),
            rule,
        };
        let s = value.trim();
        if s.starts_with('-') {
            return Err(err("must not be negative"));
        }
        let s = s.strip_prefix('+').unwrap_or(s);
        let number_end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(number_end);
        if number.is_empty() || number == "." {
            return Err(err("must start with a number"));
        }
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if frac.contains('.') {
            return Err(err("has more than one decimal point"));
        }
        let digits = format!("{whole}{frac}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 30 {
            return Err(err("has too many digits"));
        }
        let mantissa = if digits.is_empty() {
            0
        } else {
            digits
                .parse::<u128>()
                .map_err(|_| err("must start with a number"))?
        };
        let frac_len = i32::try_from(frac.len()).map_err(|_| err("has too many digits"))?;
        let (exp10, exp2) = match suffix {
            "" => (0, 0),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 10),
            "Mi" => (0, 20),
            "Gi" => (0, 30),
            "Ti" => (0, 40),
            "Pi" => (0, 50),
            "Ei" => (0, 60),
            exp if exp.starts_with(['e', 'E']) => {
                let e: i32 = exp[1..].parse().map_err(|_| err("has a bad exponent"))?;
                if !(-30..=30).contains(&e) {
                    return Err(err("has an exponent out of range"));
                }
                (e, 0)
            }
            _ => return Err(err("has an unknown suffix")),
        };
        Ok(Self {
            mantissa,
            exp10: exp10 - frac_len,
            exp2,
        })
    }

    /// `mantissa × 2^exp2 × scale`, or `None` on overflow.
    fn binary_scaled(self, scale: u128) -> Option<u128> {
        let scaled = self.mantissa.checked_mul(scale)?;
        let shifted = scaled.checked_shl(self.exp2)?;
        (shifted >> self.exp2 == scaled).then_some(shifted)
    }

    /// The value times `scale` as an exact fraction `(numerator, denominator)`.
    fn fraction(self, scale: u128) -> Option<(u128, u128)> {
        let numerator = self.binary_scaled(scale)?;
        let power = 10u128.checked_pow(self.exp10.unsigned_abs())?;
        if self.exp10 >= 0 {
            Some((numerator.checked_mul(power)?, 1))
        } else {
            Some((numerator, power))
        }
    }

    /// The value times `scale`, rounded up, or `None` when it overflows `u64`.
    fn scaled_ceil(self, scale: u128) -> Option<u64> {
        let (numerator, denominator) = self.fraction(scale)?;
        u64::try_from(numerator.div_ceil(denominator)).ok()
    }

    /// The value in milli-units, rounded up as Kubernetes does (`0.5` CPU is 500).
    pub fn milli(self) -> Option<u64> {
        self.scaled_ceil(1000)
    }

    /// The value in whole units, rounded up (bytes of memory).
    pub fn units_ceil(self) -> Option<u64> {
        self.scaled_ceil(1)
    }

    /// The value as a whole number, or `None` when it has a fractional part (device counts).
    pub fn whole(self) -> Option<u64> {
        let (numerator, denominator) = self.fraction(1)?;
        if numerator % denominator == 0 {
            u64::try_from(numerator / denominator).ok()
        } else {
            None
        }
    }
}

/// Parses a quantity of devices: a whole, non-negative number (`nvidia.com/gpu: 2`).
pub fn parse_device_count(value: &str) -> Result<u64, QuantityError> {
    Quantity::parse(value)?.whole().ok_or(QuantityError {
        value: value.to_string(),
        rule: "devices are counted in whole numbers",
    })
}

/// Parses a quantity into milli-units (`cpu: 500m` is 500).
pub fn parse_milli(value: &str) -> Result<u64, QuantityError> {
    Quantity::parse(value)?.milli().ok_or(QuantityError {
        value: value.to_string(),
        rule: "is too large",
    })
}

/// Parses a quantity of bytes (`memory: 16Gi`).
pub fn parse_bytes(value: &str) -> Result<u64, QuantityError> {
    Quantity::parse(value)?.units_ceil().ok_or(QuantityError {
        value: value.to_string(),
        rule: "is too large",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milli_displays_devices() {
        assert_eq!(Milli(8000).to_string(), "8");
        assert_eq!(Milli(1500).to_string(), "1.5");
        assert_eq!(Milli(250).to_string(), "0.25");
        assert_eq!(Milli(1).to_string(), "0.001");
        assert_eq!(Milli(1500).devices_ceil(), 2);
    }

    #[test]
    fn quantities_parse_like_kubernetes() {
        assert_eq!(parse_milli("500m").unwrap(), 500);
        assert_eq!(parse_milli("1.5").unwrap(), 1500);
        assert_eq!(parse_milli("2").unwrap(), 2000);
        assert_eq!(parse_milli("1e3").unwrap(), 1_000_000);
        assert_eq!(parse_milli("0.0001").unwrap(), 1, "rounded up");
        assert_eq!(parse_bytes("16Gi").unwrap(), 16 << 30);
        assert_eq!(parse_bytes("1k").unwrap(), 1000);
        assert_eq!(parse_bytes("1.5Ki").unwrap(), 1536);
        assert_eq!(parse_device_count("8").unwrap(), 8);
        assert_eq!(parse_device_count("0").unwrap(), 0);
    }

    #[test]
    fn bad_quantities_name_the_rule() {
        assert_eq!(
            parse_device_count("1.5").unwrap_err().rule,
            "devices are counted in whole numbers"
        );
        assert_eq!(
            parse_device_count("500m").unwrap_err().rule,
            "devices are counted in whole numbers"
        );
        assert_eq!(parse_milli("-1").unwrap_err().rule, "must not be negative");
        assert_eq!(
            parse_milli("abc").unwrap_err().rule,
            "must start with a number"
        );
        assert_eq!(parse_milli("1X").unwrap_err().rule, "has an unknown suffix");
        assert_eq!(
            parse_milli("1.2.3").unwrap_err().rule,
            "has more than one decimal point"
        );
        assert!(parse_bytes("99999999999Ei").is_err());
    }

    #[test]
    fn mig_profiles_carry_their_memory() {
        assert_eq!(
            ResourceName::new("nvidia.com/mig-1g.10gb").profile_memory_mib(),
            Some(10240)
        );
        assert_eq!(
            ResourceName::new("nvidia.com/mig-3g.40gb").profile_memory_mib(),
            Some(40960)
        );
        assert_eq!(
            ResourceName::new("nvidia.com/mig-1g.5gb+me").profile_memory_mib(),
            Some(5120)
        );
        assert_eq!(ResourceName::nvidia_gpu().profile_memory_mib(), None);
        assert!(is_gpu_resource("nvidia.com/mig-2g.20gb"));
        assert!(!is_gpu_resource("hugepages-2Mi"));
    }

    #[test]
    fn device_classes_answer_to_their_implicit_name_and_to_extended_resources() {
        assert!(may_be_device_class(
            "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
        ));
        assert!(may_be_device_class("example.com/gpu"));
        for counted_or_native in [
            "nvidia.com/gpu",
            "nvidia.com/gpumem",
            "cpu",
            "hugepages-2Mi",
            "kubernetes.io/batch-cpu",
            "scheduling.kubernetes.io/x",
        ] {
            assert!(
                !may_be_device_class(counted_or_native),
                "{counted_or_native}"
            );
        }
    }
}
