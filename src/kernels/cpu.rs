//! The CPU's vector level, found once, in this one file: in, the running CPU (and a level asked
//! for by name); out, a [`Cpu`] value that every kernel with vector forms is given (the warp, the
//! tensor conversions, the paste's halving, the colour fix's low band, the temporal filter's
//! bands, the colour conversions), so a caller, a benchmark or a test chooses the level by value
//! and nothing else does. A run's level is decided once, by `config` (the highest this CPU runs,
//! or a lower one `GPEN_VIDEO_CPU` names), and carried in its settings and engine to every
//! stage; no kernel looks the level up itself, and a test runs each kernel at every level the
//! machine has ([`Cpu::available`]) against its plain body.
//!
//! A `Cpu` above the plain level is made only where the CPU has it, so a kernel that sees
//! [`Cpu::avx2`] may run its AVX2 form: that is what every such `unsafe` call relies on.

use std::sync::OnceLock;

/// A vector level this CPU runs (see the module's note: no other can be made).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cpu(Level);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Level {
    /// What the compiler makes for the build's target (SSE2 on x86-64).
    Plain,
    /// AVX2: eight lanes.
    Avx2,
    /// AVX2 with fused multiply-adds: the crop warp's taps, whose every form fuses (the plain
    /// body through `f32::mul_add`), run their eight-lane form only here.
    Avx2Fma,
}

impl Cpu {
    /// The plain bodies, on any CPU.
    pub(crate) const PLAIN: Cpu = Cpu(Level::Plain);

    /// The highest level this CPU runs, checked once.
    pub fn detected() -> Cpu {
        static LEVEL: OnceLock<Cpu> = OnceLock::new();
        *LEVEL.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                let avx2 = is_x86_feature_detected!("avx2");
                if avx2 && is_x86_feature_detected!("fma") {
                    return Cpu(Level::Avx2Fma);
                }
                if avx2 {
                    return Cpu(Level::Avx2);
                }
            }
            Cpu::PLAIN
        })
    }

    /// Every level this CPU runs, the plain one first: what a test compares kernel by kernel.
    pub fn available() -> Vec<Cpu> {
        let top = Cpu::detected();
        [Level::Plain, Level::Avx2, Level::Avx2Fma]
            .into_iter()
            .map(Cpu)
            .filter(|c| *c <= top)
            .collect()
    }

    /// Whether kernels may run their AVX2 forms (the CPU has AVX2).
    pub(crate) fn avx2(self) -> bool {
        self.0 >= Level::Avx2
    }

    /// Whether kernels may run their AVX2 forms with fused multiply-adds (the CPU has both).
    pub(crate) fn fma(self) -> bool {
        self.0 >= Level::Avx2Fma
    }

    /// The level's name, for reports and benchmarks.
    pub fn name(self) -> &'static str {
        match self.0 {
            Level::Plain => "plain",
            Level::Avx2 => "avx2",
            Level::Avx2Fma => "avx2+fma",
        }
    }
}

impl std::str::FromStr for Cpu {
    type Err = String;

    /// The level named `plain`, `avx2` or `avx2+fma`, if this CPU runs it; a level above what it
    /// runs, or a name not known, is refused in words that list the levels it does run.
    fn from_str(name: &str) -> Result<Cpu, String> {
        let levels = || Cpu::available().iter().map(|c| c.name()).collect::<Vec<_>>().join(", ");
        let level = match name.trim().to_ascii_lowercase().as_str() {
            "plain" => Level::Plain,
            "avx2" => Level::Avx2,
            "avx2+fma" | "fma" => Level::Avx2Fma,
            _ => return Err(format!("unknown CPU level `{name}`: use one of {}", levels())),
        };
        if Cpu(level) > Cpu::detected() {
            return Err(format!(
                "this CPU does not run the {} level: use one of {}",
                Cpu(level).name(),
                levels()
            ));
        }
        Ok(Cpu(level))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_ordered_and_none_above_the_cpu_is_offered() {
        let all = Cpu::available();
        assert_eq!(all[0], Cpu::PLAIN);
        assert_eq!(*all.last().unwrap(), Cpu::detected());
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        assert!(!Cpu::PLAIN.avx2());
        #[cfg(target_arch = "x86_64")]
        assert_eq!(Cpu::detected().avx2(), is_x86_feature_detected!("avx2"));
    }

    #[test]
    fn a_level_is_named_and_none_above_the_cpu_is_made() {
        for cpu in Cpu::available() {
            assert_eq!(cpu.name().parse::<Cpu>(), Ok(cpu));
        }
        assert_eq!(" Plain ".parse::<Cpu>(), Ok(Cpu::PLAIN));
        let err = "sse9".parse::<Cpu>().unwrap_err();
        assert!(
            err.contains("unknown CPU level `sse9`") && err.contains("plain"),
            "{err}"
        );
        if Cpu::detected() < Cpu(Level::Avx2Fma) {
            let err = "avx2+fma".parse::<Cpu>().unwrap_err();
            assert!(err.contains("does not run the avx2+fma level"), "{err}");
        }
    }
}
