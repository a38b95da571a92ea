//! Which namespaces the operator watches: all (the default, one
//! ClusterRole) or a fixed list (`--watch-namespaces`, the chart's
//! `watchNamespaces`: Roles in those namespaces only, one controller per
//! namespace, and the webhook answers only for them).

use kube::{Api, Client, Resource};

/// `None`: every namespace.
pub type Namespace<'a> = Option<&'a str>;

/// The API of `K` in one namespace, or in all of them.
pub fn api<K>(client: &Client, ns: Namespace<'_>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The namespaces to run controllers for: `[None]` when the list is empty.
pub fn namespaces(watch: &[String]) -> Vec<Option<String>> {
    let mut v: Vec<String> = watch
        .iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    v.sort();
    v.dedup();
    if v.is_empty() {
        vec![None]
    } else {
        v.into_iter().map(Some).collect()
    }
}

/// Whether a request for `ns` is served (the webhook's check).
pub fn serves(watch: &[String], ns: &str) -> bool {
    let v = namespaces(watch);
    v == [None] || v.iter().flatten().any(|w| w == ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_means_everywhere_and_a_list_is_exact() {
        assert_eq!(namespaces(&[]), vec![None]);
        assert_eq!(namespaces(&[String::new()]), vec![None]);
        let w = vec!["shop".to_string(), " api ".into(), "shop".into()];
        assert_eq!(
            namespaces(&w),
            vec![Some("api".to_string()), Some("shop".to_string())]
        );
        assert!(serves(&[], "anything"));
        assert!(serves(&w, "shop"));
        assert!(!serves(&w, "shopping"));
        assert!(!serves(&w, "kube-system"));
    }
}
