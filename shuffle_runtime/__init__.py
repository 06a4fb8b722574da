"""What pyshuffle's services share at run time, beneath the contract in :mod:`shuffle_api`.

- :mod:`~shuffle_runtime.format`: the on-store partition format (data, index, manifest), its
  writer and reader;
- :mod:`~shuffle_runtime.store`, :mod:`~shuffle_runtime.store_reads`: fsspec stores and reads of
  shared (object) stores ahead of the reducers;
- :mod:`~shuffle_runtime.sockets`, :mod:`~shuffle_runtime.tls`,
  :mod:`~shuffle_runtime.connections`, :mod:`~shuffle_runtime.wire_errors`: the data ports' frames,
  TLS, pooled connections and the error table both ends of a wire share;
- :mod:`~shuffle_runtime.gate`: reading a gate's blocks from many sources within a budget;
- :mod:`~shuffle_runtime.batches`, :mod:`~shuffle_runtime.ndarrays`,
  :mod:`~shuffle_runtime.splitting_writer`: vectorized record-batch helpers and the writers'
  shared front half;
- :mod:`~shuffle_runtime.ports`: ports for daemons started on 127.0.0.1 by local clusters;
- :mod:`~shuffle_runtime.cli`, :mod:`~shuffle_runtime.package_version`: the ``pyshuffle``
  command and the version it says.

It imports only :mod:`shuffle_api`.
"""
