//! The operator's policy: what to do with an unhealthy device, by class. The same four
//! actions name what happened to a container (`action` in every record).

use crate::model::class::Class;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Warn,
    Reject,
    Remap,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Warn => "warn",
            Action::Reject => "reject",
            Action::Remap => "remap",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnUnknown {
    #[default]
    Allow,
    Reject,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// What to do with an unhealthy device whose class has no entry in `classes`.
    #[serde(default = "default_action")]
    pub default: Action,
    #[serde(default)]
    pub classes: BTreeMap<String, Action>,
    /// What to do when a probe cannot tell (NVML absent, a sysfs value unreadable).
    #[serde(default)]
    pub on_unknown: OnUnknown,
    /// A container that holds every device (a privileged one) is judged on every device
    /// it holds, not only on those assigned to it: the strict reading, off by default.
    #[serde(default)]
    pub strict_privileged: bool,
}

fn default_action() -> Action {
    Action::Reject
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            default: Action::Reject,
            classes: BTreeMap::new(),
            on_unknown: OnUnknown::Allow,
            strict_privileged: false,
        }
    }
}

impl Policy {
    pub fn action_for(&self, class: &Class) -> Action {
        self.classes
            .get(class.as_str())
            .copied()
            .unwrap_or(self.default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_json_rejects_unknown_actions() {
        let p: Policy =
            serde_json::from_str(r#"{"classes":{"block":"warn"},"on_unknown":"reject"}"#).unwrap();
        assert_eq!(p.default, Action::Reject);
        assert_eq!(p.action_for(&Class::Block), Action::Warn);
        assert!(serde_json::from_str::<Policy>(r#"{"default":"explode"}"#).is_err());
        assert!(serde_json::from_str::<Policy>(r#"{"defualt":"reject"}"#).is_err());
    }
}
