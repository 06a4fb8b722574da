"""The client side, in the Spark driver and executors: the factory, the master (one
application on the coordinators), the environment with its writers (push) and input gates
(fetch), and the client's view of several coordinators."""
