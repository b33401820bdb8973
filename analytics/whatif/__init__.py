"""What if: last week's jobs replayed on another cluster layout.

``trace`` turns the warehouse's week (or a plain pods CSV) into a replayable list of jobs;
``layout`` writes the week's own cluster layout for a person to copy and change;
``scenario`` joins the two into the simulator's scenario; ``measure`` reads the same
figures from the week's warehouse and from each replay's; ``compare`` sets them side by
side with their deltas and the replay's fidelity; ``render`` writes them out. The replay
itself (the simulator and the exporter in virtual time) is ``exporter.whatif``.
"""
