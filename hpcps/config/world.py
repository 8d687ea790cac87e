"""Whether a job fits the launch: the MPI world's size against ``[cluster]``. No MPI (the
size is given), so ``hpcps run`` checks it before it launches and every rank again inside the
launch.
"""

from __future__ import annotations

from hpcps.config.errors import ConfigError
from hpcps.config.files import display_path as _display_path


def check_world(cfg: JobConfig, world_size: int) -> None:
    """Check that the MPI world fits the job's cluster layout.

    Parameters
    ----------
    cfg : JobConfig
        The job.
    world_size : int
        Number of MPI ranks.

    Raises
    ------
    ConfigError
        With key ``"cluster.servers"`` unless ``1 <= servers <= world_size - 1`` (at least
        one server and one worker); with ``mode = "sandblaster"`` unless
        ``world_size >= servers + 2`` (also a coordinator).
    TypeError
        If `world_size` is not an int.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {type(world_size).__name__}")
    k = cfg.cluster.servers
    where = _display_path(cfg.path)
    if cfg.cluster.mode == "allreduce":
        return  # every rank is a worker; one rank is a valid (serial) run
    if cfg.cluster.mode == "sandblaster":   # coordinator (rank 0) + workers + K servers
        if not world_size >= k + 2:
            raise ConfigError(where, "cluster.servers",
                              f"mode 'sandblaster' needs a coordinator, at least one worker "
                              f"and {k} server(s): at least {k + 2} MPI ranks, got {world_size}")
        return
    if world_size < 2:
        raise ConfigError(where, "cluster.servers",
                          f"world size {world_size} is too small: need at least "
                          f"{k} + 1 = {k + 1} MPI ranks ({k} server(s) + at least 1 worker)")
    if not 1 <= k <= world_size - 1:
        raise ConfigError(where, "cluster.servers",
                          f"{k} server(s) in a world of {world_size} ranks leave "
                          f"{world_size} - {k} = {world_size - k} workers; need "
                          f"1 <= servers <= world size - 1 = {world_size - 1} "
                          f"(or launch at least {k + 1} ranks)")
