//! What machine a figure was measured on: the CPU's model name, family and model numbers, its
//! logical CPUs, its widest vector unit and its L2 cache, printed beside every benchmark's
//! figures (the project's machines change between Intel and AMD, AVX-512 and AVX2, and between
//! generations that `lscpu` names alike, e.g. "AMD EPYC" for a Zen 3, a Zen 4 and a Zen 5;
//! figures compare only within one kind).

/// `"<model name> (family <f>, model <m>), <n> logical CPUs, <vector unit>, L2 <size>"`, e.g.
/// `"AMD EPYC (family 25, model 17), 2 logical CPUs, AVX-512, L2 1 MiB"`; the model name is
/// `unknown CPU` where `/proc/cpuinfo` has none, and the numbers are left out where it has
/// none. The L2 size is the one the products are blocked by
/// ([`tensor::kernels::l2_cache_bytes`]).
pub fn describe() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let unit = tensor::kernels::VectorUnit::detect().name();
    let l2 = size_text(tensor::kernels::l2_cache_bytes());
    format!(
        "{}, {cpus} logical CPUs, {unit}, L2 {l2}",
        cpu_text(&cpuinfo)
    )
}

/// The first CPU of a `/proc/cpuinfo` text: its model name, then its family and model numbers
/// in brackets where the text has them.
fn cpu_text(cpuinfo: &str) -> String {
    let name = field(cpuinfo, "model name").unwrap_or_else(|| "unknown CPU".to_string());
    match (field(cpuinfo, "cpu family"), field(cpuinfo, "model")) {
        (Some(family), Some(model)) => format!("{name} (family {family}, model {model})"),
        _ => name,
    }
}

/// The first non-empty value of `key` in a `/proc/cpuinfo` text.
fn field(cpuinfo: &str, key: &str) -> Option<String> {
    cpuinfo
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, value)| value.trim().to_string())
        .filter(|value| !value.is_empty())
}

/// `bytes` as whole MiB where it is a multiple of one, else whole KiB.
fn size_text(bytes: usize) -> String {
    const MIB: usize = 1 << 20;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / 1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_the_first_one_s_name_family_and_model() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 167\nmodel name\t: Intel(R) Xeon(R) Processor\n\nprocessor\t: 1\nmodel name\t: Other\n";
        assert_eq!(
            cpu_text(text),
            "Intel(R) Xeon(R) Processor (family 6, model 167)"
        );
        // `model` is its own key, not a prefix of the `model name` line before it.
        assert_eq!(
            cpu_text("cpu family\t: 25\nmodel name\t: AMD EPYC\nmodel\t\t: 17\n"),
            "AMD EPYC (family 25, model 17)"
        );
        assert_eq!(
            cpu_text("model name\t: AMD EPYC\nmodel\t\t: 17\n"),
            "AMD EPYC",
            "no numbers without the family line"
        );
        assert_eq!(cpu_text("processor\t: 0\nmodel name\t: \n"), "unknown CPU");
        assert_eq!(cpu_text(""), "unknown CPU");
        let line = describe();
        assert!(
            line.contains("logical CPUs") && line.contains(", L2 "),
            "{line}"
        );
    }

    #[test]
    fn cache_sizes_read_in_the_largest_whole_unit() {
        assert_eq!(size_text(1 << 20), "1 MiB");
        assert_eq!(size_text(2 << 20), "2 MiB");
        assert_eq!(size_text(512 * 1024), "512 KiB");
        assert_eq!(size_text(1280 * 1024), "1280 KiB");
        assert_eq!(size_text(0), "0 KiB");
    }
}
