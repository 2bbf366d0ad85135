//! What machine a figure was measured on: the CPU's model name, its logical CPUs and its
//! widest vector unit, printed beside every benchmark's figures (the project's machines change
//! between Intel and AMD, AVX-512 and AVX2, and figures compare only within one kind).

/// `"<model name>, <n> logical CPUs, <vector unit>"`, e.g. `"Intel(R) Xeon(R) Processor, 2
/// logical CPUs, AVX-512"`; the model name is `unknown CPU` where `/proc/cpuinfo` has none.
pub fn describe() -> String {
    let name = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| model_name(&text))
        .unwrap_or_else(|| "unknown CPU".to_string());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let unit = tensor::kernels::VectorUnit::detect().name();
    format!("{name}, {cpus} logical CPUs, {unit}")
}

/// The first `model name` of a `/proc/cpuinfo` text.
fn model_name(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(key, _)| key.trim() == "model name")
        .map(|(_, value)| value.trim().to_string())
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_name_is_the_first_cpu_s() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel\t\t: 167\nmodel name\t: Intel(R) Xeon(R) Processor\n\nprocessor\t: 1\nmodel name\t: Other\n";
        assert_eq!(
            model_name(text).as_deref(),
            Some("Intel(R) Xeon(R) Processor")
        );
        assert_eq!(model_name("processor\t: 0\nmodel name\t: \n"), None);
        assert_eq!(model_name(""), None);
        let line = describe();
        assert!(line.contains("logical CPUs"), "{line}");
    }
}
