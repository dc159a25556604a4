"""The CPU limit read from control groups: both versions, nested limits, odd texts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from efd.daemon import cgroups

# A host with cgroup v2 only (Debian 12, a systemd service).
V2_MOUNTS = (
    "24 30 0:22 / /sys/kernel/security rw,nosuid - securityfs securityfs rw\n"
    "25 30 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec - cgroup2 cgroup2 rw,nsdelegate\n"
)
V2_SERVICE = "0::/system.slice/efd.service\n"

# A hybrid host: v1 controllers (cpu and cpuacct together) beside an empty v2 hierarchy.
HYBRID_MOUNTS = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
HYBRID_SERVICE = (
    "3:cpuset:/\n2:cpu,cpuacct:/system.slice/efd.service\n0::/system.slice/efd.service\n"
)


def reader(files: dict[str, str]) -> cgroups.Read:
    return files.get


def test_a_v2_service_quota_is_read_from_its_cpu_max() -> None:
    files = {"/sys/fs/cgroup/system.slice/efd.service/cpu.max": "50000 100000\n"}
    assert cgroups.cpu_limit(V2_SERVICE, V2_MOUNTS, reader(files)) == 0.5


def test_no_quota_is_no_limit() -> None:
    files = {
        "/sys/fs/cgroup/system.slice/efd.service/cpu.max": "max 100000\n",
        "/sys/fs/cgroup/system.slice/cpu.max": "max 100000\n",
    }
    assert cgroups.cpu_limit(V2_SERVICE, V2_MOUNTS, reader(files)) is None
    assert cgroups.cpu_limit(V2_SERVICE, V2_MOUNTS, reader({})) is None


def test_a_parent_slice_tighter_than_the_service_bounds_it() -> None:
    files = {
        "/sys/fs/cgroup/system.slice/efd.service/cpu.max": "300000 100000\n",
        "/sys/fs/cgroup/system.slice/cpu.max": "150000 100000\n",
    }
    assert cgroups.cpu_limit(V2_SERVICE, V2_MOUNTS, reader(files)) == 1.5


def test_a_v1_quota_is_read_where_the_cpu_controller_is_mounted() -> None:
    directory = "/sys/fs/cgroup/cpu,cpuacct/system.slice/efd.service"
    files = {
        f"{directory}/cpu.cfs_quota_us": "100000\n",
        f"{directory}/cpu.cfs_period_us": "100000\n",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    }
    assert cgroups.cpu_limit(HYBRID_SERVICE, HYBRID_MOUNTS, reader(files)) == 1.0


def test_the_tighter_of_v1_and_v2_wins_on_a_hybrid_host() -> None:
    files = {
        "/sys/fs/cgroup/cpu,cpuacct/system.slice/efd.service/cpu.cfs_quota_us": "250000",
        "/sys/fs/cgroup/cpu,cpuacct/system.slice/efd.service/cpu.cfs_period_us": "100000",
        "/sys/fs/cgroup/unified/system.slice/efd.service/cpu.max": "80000 100000",
    }
    assert cgroups.cpu_limit(HYBRID_SERVICE, HYBRID_MOUNTS, reader(files)) == 0.8


def test_a_container_sees_its_own_cgroup_as_the_mount() -> None:
    # Docker on cgroup v1 without a cgroup namespace: the mount's root is the container's
    # cgroup, which /proc/self/cgroup names in full.
    mounts = "700 690 0:29 /docker/abc /sys/fs/cgroup/cpu ro - cgroup cgroup rw,cpu\n"
    files = {
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "200000",
        "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000",
    }
    assert cgroups.cpu_limit("4:cpu:/docker/abc\n", mounts, reader(files)) == 2.0
    # With a namespace the process's path is "/" and the mount's root is too.
    mounts = "700 690 0:29 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert cgroups.cpu_limit("0::/\n", mounts, reader({"/sys/fs/cgroup/cpu.max": "50000 100000"}))


def test_a_mount_point_with_a_space_is_unescaped() -> None:
    mounts = r"25 30 0:23 / /run/my\040cgroups rw - cgroup2 cgroup2 rw" + "\n"
    files = {"/run/my cgroups/a/cpu.max": "100000 100000"}
    assert cgroups.cpu_limit("0::/a\n", mounts, reader(files)) == 1.0


def test_directories_run_from_the_cgroup_up_to_the_mount() -> None:
    mount = cgroups.Mount("/", "/sys/fs/cgroup", "cgroup2", frozenset({"rw"}))
    assert cgroups.limit_dirs("/a/b", mount) == [
        "/sys/fs/cgroup/a/b",
        "/sys/fs/cgroup/a",
        "/sys/fs/cgroup",
    ]
    assert cgroups.limit_dirs("/", mount) == ["/sys/fs/cgroup"]


@pytest.mark.parametrize(
    ("affinity", "limit", "expected"),
    [
        (2, None, 2),
        (2, 1.0, 1),
        (2, 1.5, 1),  # one CPU busy and half of another
        (2, 2.0, 2),
        (4, 2.5, 2),
        (2, 8.0, 2),  # a quota above the CPUs it may run on
        (2, 0.25, 1),
        (0, None, 1),
    ],
)
def test_usable_cpus_are_whole_and_at_least_one(
    affinity: int, limit: float | None, expected: int
) -> None:
    assert cgroups.usable(affinity, limit) == expected


@pytest.mark.parametrize(
    "text", ["", "max", "max 100000", "-1 100000", "0 100000", "abc 100000", "1 2 3", "5 0"]
)
def test_odd_cpu_max_texts_are_no_limit(text: str) -> None:
    assert cgroups.cpus_v2(text) is None


_TOKENS = st.sampled_from(
    ["-", "cgroup", "cgroup2", "/", "/a", "/a/b", "rw,cpu", "cpu", "0:1", "7", "\\040", "", "x"]
)
# Lines shaped like mountinfo's (six fields, "-", a type, the rest), some cut short.
_MOUNT_LINE = st.tuples(
    st.lists(_TOKENS, min_size=6, max_size=8),
    st.sampled_from(["cgroup", "cgroup2"]),
    st.lists(_TOKENS, max_size=3),
).map(lambda t: " ".join([*t[0], "-", t[1], *t[2]]))
_LINES = st.lists(
    st.one_of(_MOUNT_LINE, st.lists(_TOKENS, max_size=12).map(" ".join)), max_size=6
).map("\n".join)
_CGROUPS = st.lists(
    st.lists(
        st.sampled_from(["0", "2", "", "cpu", "cpu,cpuacct", "/", "/a", "/a/b"]), max_size=4
    ).map(":".join),
    max_size=4,
).map("\n".join)
_CONTENT = st.one_of(st.none(), st.text(), st.sampled_from(["max 100000", "-1", "50000 100000"]))


@given(
    cgroup=st.one_of(st.text(), _CGROUPS), mountinfo=st.one_of(st.text(), _LINES), content=_CONTENT
)
def test_no_text_makes_it_raise(cgroup: str, mountinfo: str, content: str | None) -> None:
    limit = cgroups.cpu_limit(cgroup, mountinfo, lambda _path: content)
    assert limit is None or limit > 0
