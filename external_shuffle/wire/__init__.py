"""What both ends of the wire share: messages to and from shuffle_api's values, errors in both
directions, the hand-framed data messages and the data port's frames, channels and auth."""
