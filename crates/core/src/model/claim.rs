//! Which queue a namespace belongs to: the one attribution rule the snapshot, the webhook and
//! the CLI share.

use super::namespace::Namespace;
use super::queue::Queue;

/// The queues that claim a namespace, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Exactly this queue claims it.
    Queue(String),
    /// Several queues claim it (names sorted): nothing of it is admitted until that is resolved.
    Conflict(Vec<String>),
    /// No queue claims it: its pods are unmanaged and count as used capacity.
    Unclaimed,
}

/// Which of `queues` claim `namespace`, by its name or by a selector over its labels.
pub fn claim_of<'a>(queues: impl IntoIterator<Item = &'a Queue>, namespace: &Namespace) -> Claim {
    let mut names: Vec<String> = queues
        .into_iter()
        .filter(|queue| queue.claims(&namespace.name, &namespace.labels))
        .map(|queue| queue.name.clone())
        .collect();
    names.sort();
    names.dedup();
    match names.len() {
        0 => Claim::Unclaimed,
        1 => Claim::Queue(names.remove(0)),
        _ => Claim::Conflict(names),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::selector::{LabelSelector, Operator, Requirement};

    fn queue(name: &str, namespaces: &[&str]) -> Queue {
        namespaces
            .iter()
            .fold(Queue::new(name), |queue, namespace| {
                queue.namespace(*namespace)
            })
    }

    #[test]
    fn one_claim_by_name_is_the_queue() {
        let queues = [queue("online", &["serving"]), queue("batch", &["jobs"])];
        assert_eq!(
            claim_of(&queues, &Namespace::new("serving")),
            Claim::Queue("online".into())
        );
        assert_eq!(
            claim_of(&queues, &Namespace::new("other")),
            Claim::Unclaimed
        );
    }

    #[test]
    fn a_name_and_a_selector_claiming_one_namespace_conflict_in_name_order() {
        let mut by_label = queue("b-label", &[]);
        by_label.namespace_selector = Some(LabelSelector {
            requirements: vec![Requirement {
                key: "team".into(),
                operator: Operator::In,
                values: vec!["ml".into()],
            }],
        });
        let queues = [queue("z-name", &["serving"]), by_label];
        let namespace = Namespace::new("serving").label("team", "ml");
        assert_eq!(
            claim_of(&queues, &namespace),
            Claim::Conflict(vec!["b-label".into(), "z-name".into()])
        );
        assert_eq!(
            claim_of(&queues, &Namespace::new("serving")),
            Claim::Queue("z-name".into())
        );
    }
}
