//! Which GPU NVIDIA's device plugin hands a replica out on next: among the GPUs with a
//! replica left, the one with the fewest allocated (not the one with the most free memory),
//! ties to the lower NVML index. The one statement of the rule: the agent's `nextGpuUuid`
//! (`src/model/replicas.rs`) and the extender's judge (`src/extender/judge.rs`, which
//! counts its pending reservations as allocated) both follow it. Pure.

/// One GPU's replicas, as the rule weighs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replicas {
    /// Replicas handed out.
    pub allocated: u32,
    /// Replicas the kubelet can hand out (0: a GPU the plugin does not advertise).
    pub allocatable: u32,
    /// NVML index; a GPU without one comes after every GPU with one.
    pub index: Option<u32>,
}

impl Replicas {
    /// The GPU's place in the plugin's order, when it has a replica left.
    fn order(&self) -> Option<(u32, u32)> {
        (self.allocated < self.allocatable)
            .then_some((self.allocated, self.index.unwrap_or(u32::MAX)))
    }
}

/// The GPU of `gpus` the plugin hands the next replica out on; `None`: no GPU has one left.
/// Of GPUs in the same place (both without an index), the first given. Allocates nothing.
pub fn next<T>(gpus: impl IntoIterator<Item = (Replicas, T)>) -> Option<T> {
    gpus.into_iter()
        .filter_map(|(r, g)| Some((r.order()?, g)))
        .min_by_key(|(place, _)| *place)
        .map(|(_, g)| g)
}

/// The `count` GPUs of `gpus` a pod of `count` GPUs gets, each once, in the plugin's order;
/// `None`: fewer than `count` have a replica left.
pub fn next_n<T>(gpus: impl IntoIterator<Item = (Replicas, T)>, count: usize) -> Option<Vec<T>> {
    let mut open: Vec<((u32, u32), T)> = gpus
        .into_iter()
        .filter_map(|(r, g)| Some((r.order()?, g)))
        .collect();
    if open.len() < count {
        return None;
    }
    open.sort_by_key(|(place, _)| *place);
    Some(open.into_iter().take(count).map(|(_, g)| g).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule's one table: GPUs as (allocated, allocatable, index), what `next` and
    /// `next_n(…, 2)` pick (by position in the list).
    #[test]
    fn table() {
        type Case = (
            &'static str,
            &'static [(u32, u32, Option<u32>)],
            Option<usize>,
            Option<[usize; 2]>,
        );
        let cases: &[Case] = &[
            (
                "fewest allocated, not the lower index",
                &[(3, 4, Some(0)), (1, 4, Some(1))],
                Some(1),
                Some([1, 0]),
            ),
            (
                "ties to the lower index, whatever the order given",
                &[(1, 4, Some(2)), (1, 4, Some(0)), (1, 4, Some(1))],
                Some(1),
                Some([1, 2]),
            ),
            (
                "a full GPU is skipped",
                &[(4, 4, Some(0)), (2, 4, Some(1)), (3, 4, Some(2))],
                Some(1),
                Some([1, 2]),
            ),
            (
                "a GPU the plugin does not advertise is skipped",
                &[(0, 0, Some(0)), (2, 4, Some(1))],
                Some(1),
                None,
            ),
            (
                "every replica out",
                &[(4, 4, Some(0)), (1, 1, Some(1))],
                None,
                None,
            ),
            (
                "a GPU without an index comes last among equals",
                &[(1, 4, None), (1, 4, Some(5))],
                Some(1),
                Some([1, 0]),
            ),
            (
                "but fewer allocated still wins",
                &[(0, 4, None), (1, 4, Some(0))],
                Some(0),
                Some([0, 1]),
            ),
            (
                "of two without an index, the first given",
                &[(2, 4, None), (2, 4, None)],
                Some(0),
                Some([0, 1]),
            ),
            ("no GPU", &[], None, None),
        ];
        for (name, gpus, one, two) in cases {
            let given = || {
                gpus.iter()
                    .enumerate()
                    .map(|(i, &(allocated, allocatable, index))| {
                        let r = Replicas {
                            allocated,
                            allocatable,
                            index,
                        };
                        (r, i)
                    })
            };
            assert_eq!(next(given()), *one, "{name}");
            assert_eq!(next_n(given(), 2), two.map(Vec::from), "{name}");
            assert_eq!(
                next_n(given(), 1),
                one.map(|i| vec![i]),
                "{name}: one of n is next"
            );
        }
    }
}
