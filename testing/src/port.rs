//! Ports for members to listen on.

use std::sync::atomic::{AtomicU32, Ordering};

/// A free loopback port for a member to listen on. Taken below Linux's
/// ephemeral range (32768+), so that no outgoing connection's source port
/// can take it between this check and the member's bind, nor while a killed
/// member is down and waits to be restarted on it; tests in one process
/// share a counter, and each process starts elsewhere in the range.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = 20_000 + (std::process::id() * 97) % 10_000;
    loop {
        let port = (start + NEXT.fetch_add(1, Ordering::Relaxed) % 12_000) as u16;
        let port = if port >= 32_000 { port - 12_000 } else { port };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        for port in ports {
            assert!((20_000..32_000).contains(&port), "{port}");
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("the port is free");
        }
    }
}
