//! Prometheus metrics of the processes under test: fetching `/metrics` from inside a
//! namespace, and reading samples out of the text exposition.

use crate::host::netns;
use std::collections::BTreeMap;
use std::time::Duration;

/// `GET /metrics` on 127.0.0.1:`port` inside `ns` (empty when nothing answers).
pub fn metrics_in(ns: &str, port: u16) -> String {
    netns::in_netns(ns, move || {
        use std::io::{Read, Write};
        let mut out = String::new();
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
            let _ = s.read_to_string(&mut out);
        }
        out
    })
    .unwrap_or_default()
}

/// The sum of the samples of `name` (every line that starts with it: a name with or
/// without labels, or a prefix of one) whose line contains every `filters` substring.
pub fn metric_sum(text: &str, name: &str, filters: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && filters.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// The value of the first sample of `name` whose labels contain `label` (`key="value"`)
/// in a Prometheus text exposition.
pub fn metric_value(text: &str, name: &str, label: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .find(|l| l.split('}').next().is_some_and(|labels| labels.contains(label)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The API server's request counters (`apiserver_request_total`) summed by
/// (verb, resource).
pub fn apiserver_requests(text: &str) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let label =
            |k: &str| line.split(&format!("{k}=\"")).nth(1).and_then(|r| r.split('"').next()).unwrap_or("").to_owned();
        let v: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        *out.entry((label("verb"), label("resource"))).or_insert(0.0) += v;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{apiserver_requests, metric_sum, metric_value};

    #[test]
    fn reads_a_metric_sample() {
        let text = "# HELP metallb_layer2_gratuitous_sent Number of gratuitous\n\
                    metallb_layer2_gratuitous_sent_total{ip=\"10.1.0.50\"} 9\n\
                    metallb_layer2_gratuitous_sent{ip=\"10.1.0.51\"} 3\n\
                    metallb_layer2_gratuitous_sent{ip=\"10.1.0.50\"} 12\n";
        assert_eq!(metric_value(text, "metallb_layer2_gratuitous_sent", "ip=\"10.1.0.50\""), Some(12.0));
        assert_eq!(metric_value(text, "metallb_layer2_gratuitous_sent", "ip=\"10.1.0.52\""), None);
    }

    #[test]
    fn sums_the_samples_whose_line_has_every_filter() {
        let text = "# HELP havip_agent_heartbeats_dropped_total Dropped heartbeats\n\
                    havip_agent_heartbeats_dropped_total{pair=\"a\",reason=\"stranger\"} 2\n\
                    havip_agent_heartbeats_dropped_total{pair=\"b\",reason=\"stranger\"} 3\n\
                    havip_agent_heartbeats_dropped_total{pair=\"a\",reason=\"bad_mac\"} 5\n";
        let name = "havip_agent_heartbeats_dropped";
        assert_eq!(metric_sum(text, name, &[]), 10.0);
        assert_eq!(metric_sum(text, name, &["reason=\"stranger\""]), 5.0);
        assert_eq!(metric_sum(text, name, &["pair=\"a\"", "stranger"]), 2.0);
        assert_eq!(metric_sum(text, "havip_operator", &[]), 0.0);
    }

    #[test]
    fn counts_api_requests_by_verb_and_resource() {
        let text = "apiserver_request_total{code=\"200\",resource=\"leases\",subresource=\"\",verb=\"PUT\"} 3\n\
                    apiserver_request_total{code=\"409\",resource=\"leases\",subresource=\"\",verb=\"PUT\"} 1\n\
                    apiserver_request_total{code=\"200\",resource=\"hapairs\",subresource=\"status\",verb=\"PATCH\"} 2\n\
                    apiserver_request_duration_seconds_count{resource=\"leases\",verb=\"PUT\"} 9\n";
        let m = apiserver_requests(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[&("PUT".to_owned(), "leases".to_owned())], 4.0);
        assert_eq!(m[&("PATCH".to_owned(), "hapairs".to_owned())], 2.0);
    }
}
