"""Launch and faults: the pre-flight check, torchrun in launch.sh's process, the status files between the
workers and launch.sh, the output_dir lock, the lifeline to the parent, preemption and error reports."""
