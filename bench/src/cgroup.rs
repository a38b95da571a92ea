//! A CPU limit for the proxy and the app together, as the kubelet gives a
//! pod: a CFS quota per 100 ms period on a cgroup of their own.
//!
//! Why the shared-core scenarios need one: on two cores, wrk on the other
//! core opens a connection per request and becomes the bottleneck before a
//! cheap pair saturates its core (kubegrace and the app used 71% of their
//! core at the same 37k req/s that took nginx and the app to 91%). The
//! closed loop then measures the load generator, not the pair. Under a
//! limit well below what wrk can feed, the pair is what runs out, and its
//! throughput is what the scenario reports.
//!
//! cgroup v1 (a `cpu` hierarchy) and v2 (the `cpu` controller enabled at
//! the root) both work; anything else is an error that says so. Each
//! process goes back to the cgroup it came from when released, and the
//! cgroup is removed on drop.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The CFS period the kubelet uses for every pod.
const PERIOD_US: u64 = 100_000;

pub struct CpuLimit {
    dir: PathBuf,
    /// The hierarchy's root: where a process's `/proc/PID/cgroup` path for
    /// this controller is anchored.
    root: PathBuf,
    v2: bool,
    /// Processes moved in, with the cgroup each came from.
    moved: Vec<(u32, PathBuf)>,
}

impl CpuLimit {
    /// A new cgroup limited to `millicores` (1000 = one CPU).
    pub fn new(millicores: u32) -> anyhow::Result<CpuLimit> {
        if millicores == 0 {
            bail!("a CPU limit of 0 millicores would stop the pair");
        }
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        let (root, v2) = if v1.join("cpu.cfs_quota_us").exists() {
            (v1.to_path_buf(), false)
        } else {
            let root = PathBuf::from("/sys/fs/cgroup");
            let controllers =
                fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
            if !controllers.split_whitespace().any(|c| c == "cpu") {
                bail!(
                    "no cgroup CPU controller to limit the pair with (neither /sys/fs/cgroup/cpu \
                     nor `cpu` in /sys/fs/cgroup/cgroup.subtree_control); set \
                     BENCH_PAIR_CPU_LIMIT=0 to run the shared-core scenarios on the whole core, \
                     where the load generator may be the bottleneck"
                );
            }
            (root, true)
        };
        let dir = root.join(format!("kubegrace-bench-pair-{}", std::process::id()));
        fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let limit = CpuLimit {
            dir,
            root,
            v2,
            moved: Vec::new(),
        };
        let quota = u64::from(millicores) * PERIOD_US / 1000;
        if v2 {
            limit.write("cpu.max", &format!("{quota} {PERIOD_US}"))?;
        } else {
            limit.write("cpu.cfs_period_us", &PERIOD_US.to_string())?;
            limit.write("cpu.cfs_quota_us", &quota.to_string())?;
        }
        Ok(limit)
    }

    fn write(&self, file: &str, value: &str) -> anyhow::Result<()> {
        let path = self.dir.join(file);
        fs::write(&path, value).with_context(|| format!("writing {value} to {}", path.display()))
    }

    /// The cgroup `pid` is in now, for this hierarchy.
    fn current(&self, pid: u32) -> anyhow::Result<PathBuf> {
        let text = fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .with_context(|| format!("reading /proc/{pid}/cgroup"))?;
        let rel = own_cgroup(&text, self.v2)
            .with_context(|| format!("/proc/{pid}/cgroup names no cpu cgroup: {text}"))?;
        Ok(self.root.join(rel.trim_start_matches('/')))
    }

    /// Moves every thread of `pid` under the limit.
    pub fn add(&mut self, pid: u32) -> anyhow::Result<()> {
        let from = self.current(pid)?;
        self.write("cgroup.procs", &pid.to_string())?;
        self.moved.push((pid, from));
        Ok(())
    }

    /// Moves every process added back where it came from. A process that
    /// has exited meanwhile is not an error.
    pub fn release_all(&mut self) -> anyhow::Result<()> {
        for (pid, from) in self.moved.drain(..) {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            let procs = from.join("cgroup.procs");
            fs::write(&procs, pid.to_string())
                .with_context(|| format!("moving {pid} back to {}", procs.display()))?;
        }
        Ok(())
    }
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        let _ = self.release_all();
        let _ = fs::remove_dir(&self.dir);
    }
}

/// The path of the cgroup a `/proc/PID/cgroup` text names for the CPU
/// controller: the `cpu` line of v1 (`4:cpu,cpuacct:/x`), or v2's `0::/x`.
fn own_cgroup(text: &str, v2: bool) -> Option<&str> {
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let wanted = if v2 {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == "cpu")
        };
        wanted.then_some(path)
    })
}

#[cfg(test)]
mod tests {
    use super::own_cgroup;

    #[test]
    fn the_cpu_cgroup_is_read_from_either_hierarchy() {
        let v1 = "9:name=systemd:/\n3:cpuset:/\n2:cpu,cpuacct:/pods/a\n1:cpuacct:/\n0::/\n";
        assert_eq!(own_cgroup(v1, false), Some("/pods/a"));
        // `cpuacct` alone is not `cpu`.
        assert_eq!(own_cgroup("1:cpuacct:/x\n", false), None);
        assert_eq!(
            own_cgroup("0::/user.slice/session-1.scope\n", true),
            Some("/user.slice/session-1.scope")
        );
        assert_eq!(own_cgroup("garbage", true), None);
    }
}
