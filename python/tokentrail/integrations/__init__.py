"""tokentrail inside trainers: each trainer's rollout seam, fed by tokentrail sessions."""
