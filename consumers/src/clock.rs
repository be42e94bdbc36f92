//! The wall clock, as KV records store times. Only executors read it; decisions take `now`.

/// Milliseconds since the Unix epoch, as KV records store times.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The time maintenance windows are read at: the wall clock, or a simulated one that starts at
/// an instant of one's choosing and runs `scale` times as fast as the wall clock (a demo fleet
/// whose nights pass in minutes, a time-scaled test). Only when sites' jobs may start reads it;
/// every record keeps wall-clock times. Clones share one simulated clock.
#[derive(Debug, Clone, Default)]
pub struct WindowClock {
    simulated: Option<std::sync::Arc<std::sync::Mutex<Simulated>>>,
}

#[derive(Debug, Clone, Copy)]
struct Simulated {
    start_ms: i64,
    scale: f64,
    origin: std::time::Instant,
}

impl WindowClock {
    /// The wall clock.
    pub fn wall() -> Self {
        Self { simulated: None }
    }

    /// A clock at `start_ms` now, running `scale` times as fast from here.
    pub fn simulated(start_ms: i64, scale: f64) -> Self {
        let sim = Simulated { start_ms, scale: scale.max(0.0), origin: std::time::Instant::now() };
        Self { simulated: Some(std::sync::Arc::new(std::sync::Mutex::new(sim))) }
    }

    /// Sets a simulated clock (and every clone of it) to `start_ms` now; the wall clock is left
    /// as it is.
    pub fn set(&self, start_ms: i64) {
        if let Some(sim) = &self.simulated {
            let mut sim = sim.lock().expect("window clock lock");
            sim.start_ms = start_ms;
            sim.origin = std::time::Instant::now();
        }
    }

    /// Milliseconds since the Unix epoch, on this clock.
    pub fn now_ms(&self) -> i64 {
        match &self.simulated {
            None => now_ms(),
            Some(sim) => {
                let sim = *sim.lock().expect("window clock lock");
                sim.start_ms + (sim.origin.elapsed().as_millis() as f64 * sim.scale) as i64
            }
        }
    }
}
