//! A converted object with its warnings: what every conversion from a Kubernetes object returns.

/// A converted object with the problems that did not stop the conversion (such as a malformed
/// optional annotation), for the operator to log or report as events.
#[derive(Clone, Debug, PartialEq)]
pub struct Converted<T> {
    pub value: T,
    pub warnings: Vec<String>,
}
