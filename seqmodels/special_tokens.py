"""Token ids that data pipelines and models both rely on, so neither imports the other.

The CFL recognition vocabulary (``seqmodels.data.cfl.rows``) opens with five fixed ids; the
looped model's loss and the CFL evaluation read the decision from the two label logits.
"""

EMPTY_ID, PAD_ID, CLS_ID, REJECT_ID, ACCEPT_ID = range(5)
CFL_FIXED_IDS = 5  # ids below this are the ones above; language BOS tokens and symbols follow
